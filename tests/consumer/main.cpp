// A tiny embedding project: includes the installed front door, creates a session (or reports
// that there is no device) and exits 0 either way; building and linking is what is tested.
#include <vkad.h>

#include <cstdio>

int main() {
  auto session = vkad::Session::create();
  if (!session.ok()) {
    std::printf("consumer: %s\n", session.status().to_string().c_str());
    return session.status().code() == vkad::ErrorCode::kNoDevice ? 0 : 1;
  }
  std::printf("consumer: running on %s\n", (*session)->device_name().c_str());
  return 0;
}
