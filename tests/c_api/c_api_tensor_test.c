/* c_api_tensor_test.c - the C API's dtypes and tensor calls, as a C11 program sees them
 * (part of the C API test: c_check.h). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "c_check.h"

/* ------------------------------------------------------------------ tensors */

static void every_dtype_has_a_width_and_a_name(void) {
  g_test = "every_dtype_has_a_width_and_a_name";
  static const struct {
    sdalloc_dtype_t dtype;
    int32_t bits;
    const char* name;
  } kTable[] = {
      {SDALLOC_DTYPE_FP32, 32, "fp32"},        {SDALLOC_DTYPE_FP16, 16, "fp16"},
      {SDALLOC_DTYPE_BF16, 16, "bf16"},        {SDALLOC_DTYPE_FP8_E4M3, 8, "fp8_e4m3"},
      {SDALLOC_DTYPE_FP8_E5M2, 8, "fp8_e5m2"}, {SDALLOC_DTYPE_INT8, 8, "int8"},
      {SDALLOC_DTYPE_UINT8, 8, "uint8"},       {SDALLOC_DTYPE_INT32, 32, "int32"},
      {SDALLOC_DTYPE_INT64, 64, "int64"},      {SDALLOC_DTYPE_INT4_PACKED, 4, "int4_packed"},
      {SDALLOC_DTYPE_FP64, 64, "fp64"},        {SDALLOC_DTYPE_INT16, 16, "int16"},
      {SDALLOC_DTYPE_BOOL, 8, "bool"},
  };
  for (size_t i = 0; i < sizeof kTable / sizeof kTable[0]; ++i) {
    CHECK(sdalloc_dtype_bits(kTable[i].dtype) == kTable[i].bits);
    CHECK(strcmp(sdalloc_dtype_name(kTable[i].dtype), kTable[i].name) == 0);
  }
  CHECK(sdalloc_dtype_bits((sdalloc_dtype_t)99) == 0);
  CHECK(strcmp(sdalloc_dtype_name((sdalloc_dtype_t)99), "unknown") == 0);
}

static void tensor_nbytes_for_every_dtype(void) {
  g_test = "tensor_nbytes_for_every_dtype";
  const int64_t dims[3] = {2, 3, 5}; /* 30 elements */
  static const struct {
    sdalloc_dtype_t dtype;
    size_t nbytes;
  } kTable[] = {
      {SDALLOC_DTYPE_FP32, 120},       {SDALLOC_DTYPE_FP16, 60},     {SDALLOC_DTYPE_BF16, 60},
      {SDALLOC_DTYPE_FP8_E4M3, 30},    {SDALLOC_DTYPE_FP8_E5M2, 30}, {SDALLOC_DTYPE_INT8, 30},
      {SDALLOC_DTYPE_UINT8, 30},       {SDALLOC_DTYPE_INT32, 120},   {SDALLOC_DTYPE_INT64, 240},
      {SDALLOC_DTYPE_INT4_PACKED, 15}, {SDALLOC_DTYPE_FP64, 240},    {SDALLOC_DTYPE_INT16, 60},
      {SDALLOC_DTYPE_BOOL, 30},
  };
  for (size_t i = 0; i < sizeof kTable / sizeof kTable[0]; ++i) {
    size_t nbytes = 0;
    CHECK_OK(sdalloc_tensor_nbytes(kTable[i].dtype, 3, dims, &nbytes));
    CHECK(nbytes == kTable[i].nbytes);
  }
}

static void packed_int4_rounds_odd_element_counts_up(void) {
  g_test = "packed_int4_rounds_odd_element_counts_up";
  size_t nbytes = 0;
  const int64_t one[1] = {1};
  const int64_t fifteen[2] = {3, 5};
  const int64_t sixteen[2] = {4, 4};
  const int64_t widest[1] = {INT64_MAX};
  CHECK_OK(sdalloc_tensor_nbytes(SDALLOC_DTYPE_INT4_PACKED, 1, one, &nbytes));
  CHECK(nbytes == 1);
  CHECK_OK(sdalloc_tensor_nbytes(SDALLOC_DTYPE_INT4_PACKED, 2, fifteen, &nbytes));
  CHECK(nbytes == 8);
  CHECK_OK(sdalloc_tensor_nbytes(SDALLOC_DTYPE_INT4_PACKED, 2, sixteen, &nbytes));
  CHECK(nbytes == 8);
  CHECK_OK(sdalloc_tensor_nbytes(SDALLOC_DTYPE_INT4_PACKED, 1, widest, &nbytes));
  CHECK(nbytes == (size_t)INT64_MAX / 2 + 1); /* ceil((2^63 - 1) / 2), no overflow */
}

static void scalar_and_empty_shapes_have_sizes(void) {
  g_test = "scalar_and_empty_shapes_have_sizes";
  size_t nbytes = 99;
  CHECK_OK(sdalloc_tensor_nbytes(SDALLOC_DTYPE_FP32, 0, NULL, &nbytes)); /* scalar */
  CHECK(nbytes == 4);
  const int64_t empty[2] = {4, 0};
  CHECK_OK(sdalloc_tensor_nbytes(SDALLOC_DTYPE_FP32, 2, empty, &nbytes));
  CHECK(nbytes == 0);
  /* A 0 dim makes the tensor empty even when the other dims alone would overflow. */
  const int64_t empty_huge[3] = {(int64_t)1 << 40, (int64_t)1 << 40, 0};
  CHECK_OK(sdalloc_tensor_nbytes(SDALLOC_DTYPE_FP32, 3, empty_huge, &nbytes));
  CHECK(nbytes == 0);
  const int64_t eight_dims[SDALLOC_MAX_DIMS] = {2, 2, 2, 2, 2, 2, 2, 2};
  CHECK_OK(sdalloc_tensor_nbytes(SDALLOC_DTYPE_INT8, SDALLOC_MAX_DIMS, eight_dims, &nbytes));
  CHECK(nbytes == 256);
}

static void tensor_nbytes_rejects_bad_shapes(void) {
  g_test = "tensor_nbytes_rejects_bad_shapes";
  const int64_t dims[2] = {4, 4};
  size_t nbytes = 99;

  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT,
               sdalloc_tensor_nbytes((sdalloc_dtype_t)99, 2, dims, &nbytes));
  CHECK(nbytes == 0);
  CHECK_MESSAGE("sdalloc_tensor_nbytes: unknown dtype 99");

  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT,
               sdalloc_tensor_nbytes(SDALLOC_DTYPE_FP32, -1, dims, &nbytes));
  CHECK_MESSAGE("ndim -1 is out of range [0, 8]");
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT,
               sdalloc_tensor_nbytes(SDALLOC_DTYPE_FP32, SDALLOC_MAX_DIMS + 1, dims, &nbytes));
  CHECK_MESSAGE("ndim 9 is out of range");

  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT,
               sdalloc_tensor_nbytes(SDALLOC_DTYPE_FP32, 2, NULL, &nbytes));
  CHECK_MESSAGE("dims is NULL but ndim is 2");

  const int64_t negative[3] = {4, -3, 0};
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT,
               sdalloc_tensor_nbytes(SDALLOC_DTYPE_FP32, 3, negative, &nbytes));
  CHECK_MESSAGE("dims[1] is negative (-3)");

  const int64_t overflow[2] = {(int64_t)1 << 40, (int64_t)1 << 40};
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT,
               sdalloc_tensor_nbytes(SDALLOC_DTYPE_FP32, 2, overflow, &nbytes));
  CHECK_MESSAGE("overflows");
  CHECK_MESSAGE("[1099511627776, 1099511627776]");

  /* The element count fits, the byte count does not (2^62 fp32 = 2^64 bytes)... */
  const int64_t bytes_overflow[1] = {(int64_t)1 << 62};
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT,
               sdalloc_tensor_nbytes(SDALLOC_DTYPE_FP32, 1, bytes_overflow, &nbytes));
  CHECK_MESSAGE("overflows");
  CHECK_MESSAGE("fp32");
  /* ...but 2^62 int8 elements are exactly 2^62 bytes. */
  CHECK_OK(sdalloc_tensor_nbytes(SDALLOC_DTYPE_INT8, 1, bytes_overflow, &nbytes));
  CHECK(nbytes == (size_t)1 << 62);

  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT,
               sdalloc_tensor_nbytes(SDALLOC_DTYPE_FP32, 2, dims, NULL));
  CHECK_MESSAGE("nbytes is NULL");
}

static void tensor_alloc_describes_a_contiguous_tensor(void) {
  g_test = "tensor_alloc_describes_a_contiguous_tensor";
  sdalloc_pool_t* pool = new_pool(0);
  sdalloc_stream_t stream = (sdalloc_stream_t)(uintptr_t)0x7;
  const int64_t dims[4] = {2, 4, 64, 64};
  sdalloc_tensor_t t;
  memset(&t, 0xEE, sizeof t);
  CHECK_OK(sdalloc_tensor_alloc(pool, SDALLOC_DTYPE_FP16, 4, dims, stream, &t));
  CHECK(t.data != NULL && is_aligned(t.data, 512));
  CHECK(t.nbytes == 65536); /* 2 * 4 * 64 * 64 elements of 2 bytes */
  CHECK(t.dtype == SDALLOC_DTYPE_FP16);
  CHECK(t.ndim == 4);
  CHECK(t.dims[0] == 2 && t.dims[1] == 4 && t.dims[2] == 64 && t.dims[3] == 64);
  CHECK(t.strides[0] == 16384 && t.strides[1] == 4096 && t.strides[2] == 64 && t.strides[3] == 1);
  for (int i = 4; i < SDALLOC_MAX_DIMS; ++i) CHECK(t.dims[i] == 0 && t.strides[i] == 0);
  CHECK(t.stream == stream);
  if (t.data != NULL) memset(t.data, 0x3C, t.nbytes);

  size_t size = 0;
  CHECK_OK(sdalloc_allocation_size(pool, t.data, &size));
  CHECK(size == t.nbytes);

  sdalloc_tensor_t stale = t; /* a copy that outlives the free */
  CHECK_OK(sdalloc_tensor_free(pool, &t));
  CHECK(t.data == NULL);
  CHECK(t.nbytes == 0);
  CHECK(t.ndim == 4 && t.dims[3] == 64);   /* the shape is kept */
  CHECK_OK(sdalloc_tensor_free(pool, &t)); /* data NULL: no-op */

  CHECK_STATUS(SDALLOC_ERROR_INVALID_POINTER, sdalloc_tensor_free(pool, &stale));
  CHECK_MESSAGE("sdalloc_tensor_free: ");
  CHECK(stale.data != NULL); /* left unchanged on failure */

  sdalloc_stats_t stats;
  stats.struct_size = sizeof stats;
  CHECK_OK(sdalloc_pool_stats(pool, &stats));
  CHECK(stats.live_allocations == 0);
  CHECK(stats.allocations == 1 && stats.frees == 1);
  sdalloc_pool_destroy(pool);
}

static void tensor_alloc_of_scalar_and_empty_tensors(void) {
  g_test = "tensor_alloc_of_scalar_and_empty_tensors";
  sdalloc_pool_t* pool = new_pool(0);
  sdalloc_tensor_t scalar;
  CHECK_OK(sdalloc_tensor_alloc(pool, SDALLOC_DTYPE_INT64, 0, NULL, NULL, &scalar));
  CHECK(scalar.data != NULL);
  CHECK(scalar.nbytes == 8);
  CHECK(scalar.ndim == 0);
  CHECK_OK(sdalloc_tensor_free(pool, &scalar));

  const int64_t dims[3] = {0, 3, 5};
  sdalloc_tensor_t empty;
  CHECK_OK(sdalloc_tensor_alloc(pool, SDALLOC_DTYPE_FP32, 3, dims, NULL, &empty));
  CHECK(empty.data == NULL);
  CHECK(empty.nbytes == 0);
  CHECK(empty.ndim == 3 && empty.dims[0] == 0 && empty.dims[2] == 5);
  CHECK(empty.strides[0] == 15 && empty.strides[1] == 5 && empty.strides[2] == 1);
  CHECK_OK(sdalloc_tensor_free(pool, &empty));

  sdalloc_stats_t stats;
  stats.struct_size = sizeof stats;
  CHECK_OK(sdalloc_pool_stats(pool, &stats));
  CHECK(stats.allocations == 1); /* the empty tensor took nothing */
  sdalloc_pool_destroy(pool);
}

static void tensor_alloc_failures_leave_a_zeroed_tensor(void) {
  g_test = "tensor_alloc_failures_leave_a_zeroed_tensor";
  sdalloc_pool_t* pool = new_pool(16 * MIB);
  sdalloc_tensor_t t;
  const int64_t overflow[2] = {(int64_t)1 << 40, (int64_t)1 << 40};
  memset(&t, 0xEE, sizeof t);
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT,
               sdalloc_tensor_alloc(pool, SDALLOC_DTYPE_FP32, 2, overflow, NULL, &t));
  CHECK(t.data == NULL && t.nbytes == 0 && t.ndim == 0);
  CHECK_MESSAGE("sdalloc_tensor_alloc: tensor size overflows");
  CHECK_OK(sdalloc_tensor_free(pool, &t)); /* freeing a failed tensor is harmless */

  /* An empty tensor whose strides would not fit in int64_t is refused too. */
  const int64_t empty_overflow[3] = {0, (int64_t)1 << 40, (int64_t)1 << 40};
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT,
               sdalloc_tensor_alloc(pool, SDALLOC_DTYPE_FP32, 3, empty_overflow, NULL, &t));
  CHECK_MESSAGE("strides");

  const int64_t too_big[2] = {1024, 1048576}; /* 4 GiB of fp32 > 16 MiB capacity */
  memset(&t, 0xEE, sizeof t);
  CHECK_STATUS(SDALLOC_ERROR_OUT_OF_MEMORY,
               sdalloc_tensor_alloc(pool, SDALLOC_DTYPE_FP32, 2, too_big, NULL, &t));
  CHECK(t.data == NULL && t.nbytes == 0);
  CHECK_MESSAGE("sdalloc_tensor_alloc: out of memory");

  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT,
               sdalloc_tensor_alloc(pool, (sdalloc_dtype_t)99, 2, overflow, NULL, &t));
  CHECK_MESSAGE("unknown dtype 99");
  const int64_t dims[1] = {16};
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT,
               sdalloc_tensor_alloc(NULL, SDALLOC_DTYPE_FP32, 1, dims, NULL, &t));
  CHECK_MESSAGE("pool is NULL");
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT,
               sdalloc_tensor_alloc(pool, SDALLOC_DTYPE_FP32, 1, dims, NULL, NULL));
  CHECK_MESSAGE("out is NULL");
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT, sdalloc_tensor_free(NULL, &t));
  CHECK_STATUS(SDALLOC_ERROR_INVALID_ARGUMENT, sdalloc_tensor_free(pool, NULL));
  CHECK_MESSAGE("tensor is NULL");

  /* After all that the pool still serves. */
  CHECK_OK(sdalloc_tensor_alloc(pool, SDALLOC_DTYPE_BF16, 1, dims, NULL, &t));
  CHECK(t.data != NULL && t.nbytes == 32);
  CHECK_OK(sdalloc_tensor_free(pool, &t));
  sdalloc_pool_destroy(pool);
}

void run_tensor_tests(void) {
  every_dtype_has_a_width_and_a_name();
  tensor_nbytes_for_every_dtype();
  packed_int4_rounds_odd_element_counts_up();
  scalar_and_empty_shapes_have_sizes();
  tensor_nbytes_rejects_bad_shapes();
  tensor_alloc_describes_a_contiguous_tensor();
  tensor_alloc_of_scalar_and_empty_tensors();
  tensor_alloc_failures_leave_a_zeroed_tensor();
}
