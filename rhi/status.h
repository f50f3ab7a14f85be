// Moved to base/status.h (Status and Result are the floor every layer stands on); this
// forwarding header keeps older includes building and will be removed.
#pragma once
#include "base/status.h"
