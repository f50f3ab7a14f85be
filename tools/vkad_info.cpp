// vkad-info: prints the device vkad would choose and its capabilities.
//   vkad-info [--device <index|name>] [--validation]
#include <cstdio>
#include <cstring>
#include <string>

#include "rhi/device.h"

int main(int argc, char** argv) {
  vkad::rhi::DeviceOptions options;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--device") == 0 && i + 1 < argc) {
      options.device = argv[++i];
    } else if (std::strcmp(argv[i], "--validation") == 0) {
      options.enable_validation = true;
    } else {
      std::fprintf(stderr, "usage: vkad-info [--device <index|name>] [--validation]\n");
      return 2;
    }
  }
  auto device = vkad::rhi::Device::create(options);
  if (!device.ok()) {
    std::fprintf(stderr, "vkad-info: %s\n", device.status().to_string().c_str());
    return 1;
  }
  std::printf("%s", (*device)->caps().to_string().c_str());
  return 0;
}
