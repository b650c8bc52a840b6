// pinned_host_resource.cpp - page-locked host memory: cudaHostAlloc and cudaHostRegister.
#include "sdalloc/cuda/pinned_host_resource.hpp"

#include <cuda_runtime_api.h>

#include <utility>

#include "cuda_call.hpp"
#include "sdalloc/core/errors.hpp"

namespace sdalloc::cuda {

namespace {

// Pinned host memory needs a working driver, though no particular device.
void require_cuda(const std::string& who) {
  int count = 0;
  detail::check(cudaGetDeviceCount(&count), who, "cudaGetDeviceCount");
}

}  // namespace

PinnedHostResource::PinnedHostResource(PinnedHostResourceOptions options) : options_(options) {
  require_cuda(name());
}

std::string PinnedHostResource::name() const { return "pinned_host"; }

void* PinnedHostResource::do_allocate(std::size_t bytes, Stream /*stream*/) {
  if (bytes == 0) return nullptr;
  unsigned flags = cudaHostAllocDefault;
  if (options_.portable) flags |= cudaHostAllocPortable;
  if (options_.mapped) flags |= cudaHostAllocMapped;
  if (options_.write_combined) flags |= cudaHostAllocWriteCombined;
  void* ptr = nullptr;
  detail::check_allocation(cudaHostAlloc(&ptr, bytes, flags), name(), "cudaHostAlloc", bytes, 0);
  return ptr;
}

void PinnedHostResource::do_deallocate(void* ptr, std::size_t /*bytes*/, Stream /*stream*/) {
  if (ptr == nullptr) return;
  const cudaError_t rc = cudaFreeHost(ptr);
  if (rc == cudaSuccess || detail::is_shutdown(rc)) return;
  detail::throw_error(name(), "cudaFreeHost", rc);
}

// --- PinnedHostRegistration -----------------------------------------------------------------

PinnedHostRegistration::PinnedHostRegistration(void* ptr, std::size_t bytes)
    : PinnedHostRegistration(ptr, bytes, Options{}) {}

PinnedHostRegistration::PinnedHostRegistration(void* ptr, std::size_t bytes, Options options) {
  const std::string who = "PinnedHostRegistration";
  if (ptr == nullptr || bytes == 0) {
    throw InvalidArgument(who + ": cannot pin " + std::to_string(bytes) + " bytes at " +
                          (ptr == nullptr ? "a null pointer" : "the given address") +
                          ": need a non-null pointer and at least one byte");
  }
  require_cuda(who);
  unsigned flags = cudaHostRegisterDefault;
  if (options.portable) flags |= cudaHostRegisterPortable;
  if (options.mapped) flags |= cudaHostRegisterMapped;
  if (options.read_only) flags |= cudaHostRegisterReadOnly;
  const cudaError_t rc = cudaHostRegister(ptr, bytes, flags);
  if (rc == cudaErrorHostMemoryAlreadyRegistered) {
    (void)cudaGetLastError();
    throw InvalidArgument(who + ": the memory is already page-locked (cudaHostRegister: " +
                          detail::describe(rc) + ")");
  }
  detail::check(rc, who, "cudaHostRegister");
  ptr_ = ptr;
  bytes_ = bytes;
}

PinnedHostRegistration::PinnedHostRegistration(PinnedHostRegistration&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

PinnedHostRegistration& PinnedHostRegistration::operator=(PinnedHostRegistration&& other) noexcept {
  if (this != &other) {
    unregister();
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

PinnedHostRegistration::~PinnedHostRegistration() { unregister(); }

void PinnedHostRegistration::unregister() noexcept {
  if (ptr_ == nullptr) return;
  // Nothing to report to from a destructor; a failure leaves the pages locked until exit.
  if (cudaHostUnregister(ptr_) != cudaSuccess) (void)cudaGetLastError();
  ptr_ = nullptr;
  bytes_ = 0;
}

}  // namespace sdalloc::cuda
