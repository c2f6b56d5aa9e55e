/* lora.cu — bk_lora: a LoRA adapter's low-rank delta on a run of rows,
 * y += scale · (x · aᵀ) · bᵀ, with t = x · aᵀ ([n, r], f32) in the device
 * scratch. Decode-sized runs (n <= LORA_SMALL_N, what a recorded step holds)
 * use two plain kernels: one block per (row, rank) reduces over the inputs,
 * then one thread per (row, output) sums over the rank, each in a fixed
 * order. Larger runs use two cuBLAS f32 GEMMs (no TF32), rows in chunks that
 * fit the scratch; row-major y = x Wᵀ is column-major yᵀ = W xᵀ for cuBLAS,
 * as in matmul.cu. */
#include "backend/cuda/cuda_common.cuh"

#define LORA_SMALL_N 8
#define LORA_THREADS 128

/* t[i, j] = sum_k x[i, k] a[j, k]: block (j, i), a strided partial sum per thread, then a tree. */
__global__ void lora_down_kernel(float *t, const float *x, const float *a, int64_t in, int64_t r) {
  __shared__ float part[LORA_THREADS];
  int64_t j = blockIdx.x, i = blockIdx.y;
  const float *xi = x + i * in, *aj = a + j * in;
  float s = 0.0f;
  for (int64_t k = threadIdx.x; k < in; k += LORA_THREADS) s = fmaf(xi[k], aj[k], s);
  part[threadIdx.x] = s;
  __syncthreads();
  for (int w = LORA_THREADS / 2; w > 0; w /= 2) {
    if ((int)threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) t[i * r + j] = part[0];
}

/* y[i, o] += scale * sum_j t[i, j] b[o, j] */
__global__ void lora_up_kernel(float *y, const float *t, const float *b, int64_t n, int64_t out, int64_t r, float scale) {
  int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= n * out) return;
  int64_t i = idx / out, o = idx % out;
  const float *ti = t + i * r, *bo = b + o * r;
  float s = 0.0f;
  for (int64_t j = 0; j < r; j++) s = fmaf(ti[j], bo[j], s);
  y[idx] += scale * s;
}

void cu_lora(bk_backend *be, const bk_tensor *y, const bk_tensor *x, const bk_tensor *a, const bk_tensor *bt, float scale) {
  cu_backend *b = cu_be(be);
  if (b->err.code) return;
  int64_t n = x->rows, in = x->cols, r = a->rows, out = bt->rows;
  if (a->cols != in || bt->cols != r || y->cols != out || y->rows != n) {
    cu_fail(b, HEARTH_EINTERNAL, "cuda lora: y [%lld, %lld], x [%lld, %lld], a [%lld, %lld], b [%lld, %lld] do not fit",
            (long long)y->rows, (long long)y->cols, (long long)n, (long long)in, (long long)a->rows, (long long)a->cols,
            (long long)bt->rows, (long long)bt->cols);
    return;
  }
  if (n <= 0 || r <= 0) return;
  cudaSetDevice(b->device);
  int64_t chunk = (int64_t)(CU_SCRATCH_CAP / ((size_t)r * sizeof(float)));
  if (chunk > n) chunk = n;
  float *t = (float *)cu_scratch(b, (size_t)(chunk * r) * sizeof(float));
  if (!t) return;
  if (n <= LORA_SMALL_N) {
    lora_down_kernel<<<dim3((unsigned)r, (unsigned)n), LORA_THREADS, 0, b->stream>>>(t, cu_f(x), cu_f(a), in, r);
    lora_up_kernel<<<cu_blocks(n * out, 256), 256, 0, b->stream>>>(cu_fw(y), t, cu_f(bt), n, out, r, scale);
    cu_check(b, "lora");
    return;
  }
  const float one = 1.0f, zero = 0.0f;
  for (int64_t r0 = 0; r0 < n; r0 += chunk) {
    int64_t m = n - r0 < chunk ? n - r0 : chunk;
    const float *xs = cu_f(x) + r0 * in;
    float *ys = cu_fw(y) + r0 * out;
    cublasStatus_t st = cublasSgemm(b->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)r, (int)m, (int)in, &one, cu_f(a), (int)in, xs,
                                    (int)in, &zero, t, (int)r);
    if (cu_check_blas(b, st, "lora (x · aᵀ)")) return;
    st = cublasSgemm(b->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)out, (int)m, (int)r, &scale, cu_f(bt), (int)r, t, (int)r, &one, ys,
                     (int)out);
    if (cu_check_blas(b, st, "lora (t · bᵀ)")) return;
  }
}
