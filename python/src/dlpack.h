// The DLPack ABI (https://github.com/dmlc/dlpack, dlpack.h, MIT licence): the structs a
// producer and a consumer of the Python array API's `__dlpack__` exchange, declared here with the
// same layout so vkad needs no copy of the header. Version 1.x adds DLManagedTensorVersioned
// (capsule name "dltensor_versioned"); the legacy DLManagedTensor travels as "dltensor". A
// consumer renames the capsule it takes to "used_dltensor" / "used_dltensor_versioned" and
// calls the deleter when it is done; a capsule still carrying its original name when it is
// destroyed was never consumed, and its destructor calls the deleter.
#pragma once

#include <cstdint>

namespace vkad::dlpack {

inline constexpr uint32_t kMajorVersion = 1;
inline constexpr uint32_t kMinorVersion = 0;

struct Version {
  uint32_t major;
  uint32_t minor;
};

enum DeviceType : int32_t {
  kDLCPU = 1,
  kDLCUDA = 2,
  kDLCUDAHost = 3,
  kDLVulkan = 7,
  kDLCUDAManaged = 13,
};

struct Device {
  int32_t device_type;  // DeviceType
  int32_t device_id;
};

enum DataTypeCode : uint8_t { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4, kDLBool = 6 };

struct DataType {
  uint8_t code;  // DataTypeCode
  uint8_t bits;
  uint16_t lanes;
};

struct Tensor {
  void* data;
  Device device;
  int32_t ndim;
  DataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; null means compact row-major (legacy producers)
  uint64_t byte_offset;
};

struct ManagedTensor {
  Tensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(ManagedTensor* self);
};

inline constexpr uint64_t kFlagReadOnly = 1ull << 0;
inline constexpr uint64_t kFlagIsCopied = 1ull << 1;

struct ManagedTensorVersioned {
  Version version;
  void* manager_ctx;
  void (*deleter)(ManagedTensorVersioned* self);
  uint64_t flags;
  Tensor dl_tensor;
};

inline constexpr const char* kCapsule = "dltensor";
inline constexpr const char* kCapsuleVersioned = "dltensor_versioned";
inline constexpr const char* kUsedCapsule = "used_dltensor";
inline constexpr const char* kUsedCapsuleVersioned = "used_dltensor_versioned";

}  // namespace vkad::dlpack
