#include <cuda_runtime.h>

#include "device_info.h"

namespace pagedcore {
namespace cuda {

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error so later calls start clean
    return 0;
  }
  return count;
}

}  // namespace cuda
}  // namespace pagedcore
