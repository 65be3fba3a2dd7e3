/* dlpack.h: the DLPack tensor structs (ABI-compatible with DLPack 0.8+),
 * the ecosystem's convention for passing tensors between libraries. */
#ifndef FLEXC_DLPACK_H
#define FLEXC_DLPACK_H

#include <stdint.h>

typedef enum {
  kDLCPU = 1,
  kDLCUDA = 2,
  kDLCUDAHost = 3,
  kDLCUDAManaged = 13,
} DLDeviceType;

typedef struct {
  DLDeviceType device_type;
  int32_t device_id;
} DLDevice;

typedef enum {
  kDLInt = 0U,
  kDLUInt = 1U,
  kDLFloat = 2U,
  kDLOpaqueHandle = 3U,
  kDLBfloat = 4U,
  kDLComplex = 5U,
  kDLBool = 6U,
} DLDataTypeCode;

typedef struct {
  uint8_t code;   /* DLDataTypeCode */
  uint8_t bits;   /* 16, 32, 64, 8 (bool is 8 bits) */
  uint16_t lanes; /* 1 */
} DLDataType;

typedef struct {
  void *data;           /* base pointer (device or host) */
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t *shape;       /* ndim extents */
  int64_t *strides;     /* ndim strides in elements; NULL means compact row-major */
  uint64_t byte_offset; /* added to data */
} DLTensor;

#endif
