// What the CUDA runtime sees on this machine; safe to call with no GPU or no driver.
#pragma once

namespace pagedcore {
namespace cuda {

// Number of visible CUDA devices; 0 when there is no driver or no device.
int device_count();

}  // namespace cuda
}  // namespace pagedcore
