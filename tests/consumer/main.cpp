// A tiny embedding project: includes the installed umbrella header, creates a device (or
// reports that there is none) and exits 0 either way; building and linking is what is tested.
#include <vkad.h>

#include <cstdio>

int main() {
  auto device = vkad::rhi::Device::create();
  if (!device.ok()) {
    std::printf("consumer: %s\n", device.status().to_string().c_str());
    return device.status().code() == vkad::ErrorCode::kNoDevice ? 0 : 1;
  }
  std::printf("consumer: running on %s\n", (*device)->caps().device_name.c_str());
  return 0;
}
