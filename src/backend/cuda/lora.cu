/* lora.cu — bk_lora: a LoRA adapter's low-rank delta on a run of rows,
 * y += scale · (x · aᵀ) · bᵀ, as two cuBLAS f32 GEMMs (no TF32): t = x · aᵀ
 * into the device scratch (rows in chunks that fit it), then
 * y = scale · t · bᵀ + y. Row-major y = x Wᵀ is column-major yᵀ = W xᵀ for
 * cuBLAS, as in matmul.cu. */
#include "backend/cuda/cuda_common.cuh"

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
