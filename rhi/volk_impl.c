/* volk's loader-less function table, compiled once into libvkad (Debian ships volk as source). */
#define VOLK_IMPLEMENTATION
#include <volk.h>
