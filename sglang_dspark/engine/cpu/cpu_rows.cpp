// Row-invariant CPU kernels for decode and verify rows (AVX-512 with BF16 dot products).
//
// Each output row is computed by the same instructions in the same order however many rows share
// the call and however the threads split it, so a verify block's rows equal the one-row decodes
// they replace bit for bit, and a request's rows do not depend on what is batched beside it.
//
// q4_rows_mm, q8_rows_mm: y = x W^T for GGUF Q4_1 weights (4-bit groups of 32, float16 scale and
//   minimum) or int8 weights (a float32 scale per output row), bfloat16 rows in and out, each block
//   of 32 of a row quantized to int8 (llama.cpp's Q8_1) and multiplied by VNNI integer dot products.
//   The weights stream from memory once per call whatever the row count.
// rows_attention: softmax(q K^T * scale) V per row and query head over the first row_keys[t] keys of
//   its slot's cache, float32 accumulation, one thread per (row, kv head).
// rows_rmsnorm, rows_add_rmsnorm, rows_rope_store, rows_silu_mul: a decoder layer's elementwise
//   parts, row by row, in float32 rounded once to bfloat16.
// markov_argmax_chain: the drafter's greedy sequential stage (vanilla Markov head), every position.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>
#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <vector>

namespace {

inline uint16_t float_to_bf16(float f) {  // round to nearest even, as c10::BFloat16
  return c10::BFloat16(f).x;
}

inline float bf16_to_float_scalar(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline __m512bh load_bh(const uint16_t* p) { return (__m512bh)_mm512_loadu_si512(p); }

inline __m512 bf16x16_to_ps(const uint16_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}

// ---- q4_rows_mm, q8_rows_mm ------------------------------------------------------------------

constexpr int64_t kGroup = 32;    // Q4_1's block: a scale d and minimum m per 32 weights, w = d * q + m
constexpr int64_t kLanes = 16;    // output features per block (one float32 vector)
constexpr int64_t kRowTile = 6;   // at most this many rows multiplied together (register blocking only:
                                  // 7 or 8 spilled, 8 rows cost 1.5x 6 on an AMD EPYC Zen 5)

// Rows' activations in blocks of 32 as int8 with one scale each (llama.cpp's Q8_1):
// xq = round(x / dx), dx = max |x| / 127; xsum = sum(xq) carries the Q4_1 minimum's term and the
// Q8 weights' +128 offset.
struct QuantizedRows {
  std::vector<int8_t> xq;
  std::vector<float> dx;
  std::vector<int32_t> xsum;
};

QuantizedRows quantize_rows(const uint16_t* X, int64_t M, int64_t K) {
  const int64_t groups = K / kGroup;
  QuantizedRows q{std::vector<int8_t>(M * K), std::vector<float>(M * groups), std::vector<int32_t>(M * groups)};
  for (int64_t r = 0; r < M; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      const uint16_t* p = X + r * K + g * kGroup;
      const __m512 a = bf16x16_to_ps(p), b = bf16x16_to_ps(p + 16);
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
      const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
      // round to nearest even; clamped so that a NaN or inf row (INT_MIN here) keeps xsum in range,
      // and its dx is NaN so the output shows it
      const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
      const __m512i qa = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(a, _mm512_set1_ps(id))), lo), hi);
      const __m512i qb = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(b, _mm512_set1_ps(id))), lo), hi);
      int8_t* out = q.xq.data() + r * K + g * kGroup;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm512_cvtsepi32_epi8(qa));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 16), _mm512_cvtsepi32_epi8(qb));
      const bool nan = (_mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(b, b, _CMP_UNORD_Q)) != 0;
      q.dx[r * groups + g] = std::isfinite(amax) && !nan ? amax / 127.0f : NAN;  // max_ps skips NaN: test it
      q.xsum[r * groups + g] = _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb));
    }
  return q;
}

// A group's 8 VNNI dot products of 16 lanes x 4 weights with one row's int8 blocks, in two
// dependency chains (each op waits for the last one of its chain); int32 sums are exact.
inline int32_t four_bytes(const int8_t* p) {  // memcpy: no int32 read of int8 storage (strict aliasing)
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline __m512i group_dot(const __m512i* w, const int8_t* xr, __m512i init) {
  __m512i dot0 = init, dot1 = _mm512_setzero_si512();
  for (int t = 0; t < 8; t += 2) {
    dot0 = _mm512_dpbusd_epi32(dot0, w[t], _mm512_set1_epi32(four_bytes(xr + 4 * t)));
    dot1 = _mm512_dpbusd_epi32(dot1, w[t + 1], _mm512_set1_epi32(four_bytes(xr + 4 * t + 4)));
  }
  return _mm512_add_epi32(dot0, dot1);
}

// Q4_1: per group the packed weights are 4 vectors of 64 bytes; byte 4n + b of vector j holds
// q[n][8j + b] (low nibble) and q[n][8j + 4 + b] (high), so each nibble plane is 16 lanes x 4
// consecutive weights. y = sum_g d (q . xq) dx + m dx sum(xq).
template <int R>
inline void block_rows_q4(const uint8_t* qblock, const uint16_t* dmblock, int64_t groups, const QuantizedRows& x,
                          int64_t r0, int64_t K, float* out) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  for (int64_t g = 0; g < groups; ++g) {
    __m512i w[8];
    for (int j = 0; j < 4; ++j) {
      const __m512i packed = _mm512_loadu_si512(qblock + g * 256 + 64 * j);
      w[2 * j] = _mm512_and_si512(packed, nibble);
      w[2 * j + 1] = _mm512_and_si512(_mm512_srli_epi16(packed, 4), nibble);
    }
    const uint16_t* dm = dmblock + g * 2 * kLanes;
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(dm)));
    const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(dm + kLanes)));
    for (int r = 0; r < R; ++r) {
      const int64_t i = (r0 + r) * groups + g;
      const __m512i dot = group_dot(w, x.xq.data() + (r0 + r) * K + g * kGroup, _mm512_setzero_si512());
      const float dx = x.dx[i];
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(d, _mm512_set1_ps(dx)), acc[r]);
      acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(dx * static_cast<float>(x.xsum[i])), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(out + r * kLanes, acc[r]);
}

// Q8, stored as w + 128 (VNNI multiplies unsigned by signed bytes): per group 8 vectors, byte 4n + b
// of vector t holding w[n][4t + b] + 128, so (w + 128) . xq - 128 sum(xq) = w . xq. The per-row
// weight scale is applied by the caller.
template <int R>
inline void block_rows_q8(const uint8_t* qblock, int64_t groups, const QuantizedRows& x, int64_t r0, int64_t K,
                          float* out) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m512i w[8];
    for (int t = 0; t < 8; ++t) w[t] = _mm512_loadu_si512(qblock + g * 512 + 64 * t);
    for (int r = 0; r < R; ++r) {
      const int64_t i = (r0 + r) * groups + g;
      const __m512i dot = group_dot(w, x.xq.data() + (r0 + r) * K + g * kGroup, _mm512_set1_epi32(-128 * x.xsum[i]));
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_set1_ps(x.dx[i]), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(out + r * kLanes, acc[r]);
}

// f(std::integral_constant<int, k>) for k = n clamped to 1..N: a count as a template argument
template <int N, class F>
inline void with_count(int64_t n, F&& f) {
  if constexpr (N > 1) {
    if (n < N) return with_count<N - 1>(n, f);
  }
  f(std::integral_constant<int, N>{});
}

// Rows of tile t when M rows are split into the fewest tiles of at most kRowTile, as evenly as
// can be: a tile of few rows is latency-bound (its dot products are short dependency chains), so 8
// rows run as 4 + 4, not 6 + 2. Which tile a row lands in never changes its arithmetic.
inline int64_t rows_in_tile(int64_t M, int64_t t) {
  const int64_t tiles = (M + kRowTile - 1) / kRowTile;
  return M / tiles + (t < M % tiles ? 1 : 0);
}

// What both GEMMs share: quantize the rows once, then per block of 16 output features (threads split
// the blocks) and tile of up to kRowTile rows, tile(block, first row, rows, x, out [rows][16] float32), rounded
// to bfloat16 into y [M, blocks * 16].
template <class Tile>
at::Tensor rows_mm(const at::Tensor& x, int64_t blocks, Tile tile) {
  const int64_t M = x.size(0), K = x.size(1), N = blocks * kLanes;
  at::Tensor y = at::empty({M, N}, x.options());
  if (M == 0) return y;
  const QuantizedRows q = quantize_rows(reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>()), M, K);
  auto* Y = reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>());
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    float out[kRowTile * kLanes];
    for (int64_t b = begin; b < end; ++b)
      for (int64_t r0 = 0, t = 0, rows; r0 < M; r0 += rows, ++t) {
        rows = rows_in_tile(M, t);
        tile(b, r0, rows, q, out);
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t n = 0; n < kLanes; ++n) Y[(r0 + r) * N + b * kLanes + n] = float_to_bf16(out[r * kLanes + n]);
      }
  });
  return y;
}

void check_rows(const at::Tensor& x, const char* name) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16 && x.is_contiguous(), name, ": x: contiguous bfloat16 [M, K]");
  TORCH_CHECK(x.size(1) % kGroup == 0, name, " needs K % 32 == 0");
}

at::Tensor q4_rows_mm(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scale_min) {
  check_rows(x, "q4_rows_mm");
  const int64_t K = x.size(1), groups = K / kGroup;
  TORCH_CHECK(qweight.dim() == 4 && qweight.scalar_type() == at::kByte && qweight.is_contiguous() &&
                  qweight.size(1) == groups && qweight.size(2) == 4 && qweight.size(3) == 64,
              "qweight: contiguous uint8 [N / 16, K / 32, 4, 64]");
  const int64_t blocks = qweight.size(0);
  TORCH_CHECK(scale_min.scalar_type() == at::kHalf && scale_min.is_contiguous() &&
                  scale_min.numel() == blocks * groups * 2 * kLanes,
              "scale_min: contiguous float16 [N / 16, K / 32, 2, 16]");
  const auto* Q = qweight.data_ptr<uint8_t>();
  const auto* DM = reinterpret_cast<const uint16_t*>(scale_min.data_ptr<at::Half>());
  return rows_mm(x, blocks, [&](int64_t b, int64_t r0, int64_t rows, const QuantizedRows& q, float* out) {
    with_count<kRowTile>(rows, [&](auto R) {
      block_rows_q4<decltype(R)::value>(Q + b * groups * 256, DM + b * groups * 2 * kLanes, groups, q, r0, K, out);
    });
  });
}

at::Tensor q8_rows_mm(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scale) {
  check_rows(x, "q8_rows_mm");
  const int64_t K = x.size(1), groups = K / kGroup;
  TORCH_CHECK(qweight.dim() == 4 && qweight.scalar_type() == at::kByte && qweight.is_contiguous() &&
                  qweight.size(1) == groups && qweight.size(2) == 8 && qweight.size(3) == 64,
              "qweight: contiguous uint8 [N / 16, K / 32, 8, 64]");
  const int64_t blocks = qweight.size(0);
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.is_contiguous() && scale.numel() == blocks * kLanes,
              "scale: contiguous float32 [N]");
  const auto* Q = qweight.data_ptr<uint8_t>();
  const float* S = scale.data_ptr<float>();
  return rows_mm(x, blocks, [&](int64_t b, int64_t r0, int64_t rows, const QuantizedRows& q, float* out) {
    with_count<kRowTile>(rows, [&](auto R) { block_rows_q8<decltype(R)::value>(Q + b * groups * 512, groups, q, r0, K, out); });
    const __m512 s = _mm512_loadu_ps(S + b * kLanes);
    for (int64_t r = 0; r < rows; ++r) _mm512_storeu_ps(out + r * kLanes, _mm512_mul_ps(_mm512_loadu_ps(out + r * kLanes), s));
  });
}

// ---- rows_attention ------------------------------------------------------------------------------

// exp(x) for any x: Cody-Waite reduction and a degree-6 polynomial, the input clamped to float's range
inline __m512 exp_any(__m512 x) {
  // max / min return their second operand when either is NaN: x second, so a NaN stays NaN
  x = _mm512_min_ps(_mm512_set1_ps(88.0f), _mm512_max_ps(_mm512_set1_ps(-87.0f), x));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.0f / 720);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}



// Lane i of the result: the sum of v[i]'s 16 lanes. Every lane's sum is the same tree, (e0 + e2) +
// (e1 + e3) within each 128-bit quarter, then the quarters (q0 + q1) + (q2 + q3), whichever lane
// (key) it is: a key's score does not depend on the keys beside it. About 2.6 instructions a key
// against about 12 for a reduce_add each.
inline __m512 sum16(const __m512* v) {
  __m512 pairs[8], quads[4];
  for (int i = 0; i < 8; ++i)
    pairs[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(pairs[2 * i]), b = _mm512_castps_pd(pairs[2 * i + 1]);
    quads[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  // quads[i], quarter k: keys 4i..4i+3 over v's quarter k; fold quarters 0+1 and 2+3, then those
  const __m512 s01 = _mm512_add_ps(_mm512_shuffle_f32x4(quads[0], quads[1], 0x88), _mm512_shuffle_f32x4(quads[0], quads[1], 0xDD));
  const __m512 s23 = _mm512_add_ps(_mm512_shuffle_f32x4(quads[2], quads[3], 0x88), _mm512_shuffle_f32x4(quads[2], quads[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(s01, s23, 0x88), _mm512_shuffle_f32x4(s01, s23, 0xDD));
}

constexpr int kMaxGroup = 16;   // query heads per kv head
constexpr int kMaxHeadDim = 256;

// scores[j] = (q . k_j) * scale for the n keys at K (rows of hd), q as C vectors of 32 bfloat16 held
// in registers; 16 keys at a time, their dot-product vectors summed across lanes together (sum16).
template <int C>
inline void key_scores(const uint16_t* q, const uint16_t* K, int64_t n, int64_t hd, float scale, float* scores) {
  __mmask32 lanes[C];
  __m512bh qv[C];
  for (int c = 0; c < C; ++c) {
    const int64_t left = hd - 32 * c;
    lanes[c] = left >= 32 ? ~0u : (1u << left) - 1;
    qv[c] = (__m512bh)_mm512_maskz_loadu_epi16(lanes[c], q + 32 * c);
  }
  for (int64_t j0 = 0; j0 < n; j0 += 16) {
    const int64_t count = std::min<int64_t>(16, n - j0);
    __m512 acc[16];
    for (int jj = 0; jj < 16; ++jj) acc[jj] = _mm512_setzero_ps();
    for (int64_t jj = 0; jj < count; ++jj) {
      const uint16_t* kj = K + (j0 + jj) * hd;
      for (int c = 0; c < C; ++c)
        acc[jj] = _mm512_dpbf16_ps(acc[jj], qv[c], (__m512bh)_mm512_maskz_loadu_epi16(lanes[c], kj + 32 * c));
    }
    _mm512_mask_storeu_ps(scores + j0, static_cast<__mmask16>((1u << count) - 1),
                          _mm512_mul_ps(sum16(acc), _mm512_set1_ps(scale)));
  }
}

// Heads h < GB (their probabilities at p + h * stride, unnormalized) times the cache's V rows, lanes
// 16 (c0 + c) .. of the head for c < CB, divided by the heads' sums, into bfloat16 out + h * hd. The
// accumulators stay in registers (GB x CB <= 16); each sums its keys in order, one fma each.
template <int GB, int CB>
inline void weighted_values(const float* p, int64_t stride, const float* inv_sum, const uint16_t* V, int64_t n,
                            int64_t hd, int64_t c0, uint16_t* out) {
  __m512 acc[GB][CB];
  __mmask16 lanes[CB];
  for (int c = 0; c < CB; ++c) {
    const int64_t left = hd - 16 * (c0 + c);
    lanes[c] = static_cast<__mmask16>(left >= 16 ? 0xFFFF : (1u << left) - 1);
    for (int h = 0; h < GB; ++h) acc[h][c] = _mm512_setzero_ps();
  }
  for (int64_t j = 0; j < n; ++j) {
    const uint16_t* vj = V + j * hd + 16 * c0;
    for (int c = 0; c < CB; ++c) {
      const __m512 v = _mm512_castsi512_ps(_mm512_slli_epi32(
          _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(lanes[c], vj + 16 * c)), 16));
      for (int h = 0; h < GB; ++h) acc[h][c] = _mm512_fmadd_ps(_mm512_set1_ps(p[h * stride + j]), v, acc[h][c]);
    }
  }
  for (int h = 0; h < GB; ++h)
    for (int c = 0; c < CB; ++c) {
      float tmp[16];
      _mm512_storeu_ps(tmp, _mm512_mul_ps(acc[h][c], _mm512_set1_ps(inv_sum[h])));
      const int64_t first = 16 * (c0 + c);
      for (int64_t i = 0; i < std::min<int64_t>(16, hd - first); ++i) out[h * hd + first + i] = float_to_bf16(tmp[i]);
    }
}

at::Tensor rows_attention(const at::Tensor& q, const at::Tensor& kv, const at::Tensor& row_slot,
                          const at::Tensor& row_keys, double scale) {
  TORCH_CHECK(q.dim() == 3 && q.scalar_type() == at::kBFloat16 && q.is_contiguous(), "q: contiguous bfloat16 [T, H, hd]");
  TORCH_CHECK(kv.dim() == 5 && kv.scalar_type() == at::kBFloat16 && kv.is_contiguous() && kv.size(0) == 2,
              "kv: one layer's contiguous bfloat16 cache [2, slots, kv_heads, max_len, hd]");
  const int64_t T = q.size(0), H = q.size(1), hd = q.size(2);
  const int64_t S = kv.size(1), KVH = kv.size(2), L = kv.size(3);
  TORCH_CHECK(H > 0 && KVH > 0, "rows_attention: no heads");
  TORCH_CHECK(kv.size(4) == hd && H % KVH == 0 && H / KVH <= kMaxGroup && hd >= 1 && hd <= kMaxHeadDim,
              "rows_attention: head_dim <= 256 (q's and the cache's) and at most 16 query heads per kv head");
  TORCH_CHECK(row_slot.scalar_type() == at::kLong && row_keys.scalar_type() == at::kLong && row_slot.numel() == T &&
                  row_keys.numel() == T && row_slot.is_contiguous() && row_keys.is_contiguous(),
              "row_slot, row_keys: contiguous int64 [T]");
  const int64_t G = H / KVH;
  const auto* slots = row_slot.data_ptr<int64_t>();
  const auto* keys = row_keys.data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t)
    TORCH_CHECK(slots[t] >= 0 && slots[t] < S && keys[t] >= 1 && keys[t] <= L, "row ", t, ": slot or key count out of range");
  at::Tensor out = at::empty({T, H * hd}, q.options());
  const auto* Qp = reinterpret_cast<const uint16_t*>(q.data_ptr<at::BFloat16>());
  const auto* KVp = reinterpret_cast<const uint16_t*>(kv.data_ptr<at::BFloat16>());
  auto* Op = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  const float sc = static_cast<float>(scale);
  // a head_dim that is not a multiple of 16 or 32 takes masked loads
  const int64_t chunks = (hd + 15) / 16, chunks32 = (hd + 31) / 32;
  at::parallel_for(0, T * KVH, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t = item / KVH, kvh = item % KVH, n = keys[t];
      const uint16_t* Kc = KVp + ((0 * S + slots[t]) * KVH + kvh) * L * hd;
      const uint16_t* Vc = KVp + ((1 * S + slots[t]) * KVH + kvh) * L * hd;
      const int64_t padded = (n + 15) / 16 * 16;
      scores.assign(G * padded, -INFINITY);
      // scores: q . k in float32 (bfloat16 products are exact), scaled; 16 keys at a time, their 16
      // dot-product vectors summed across lanes together (sum16)
      for (int64_t h = 0; h < G; ++h)
        with_count<kMaxHeadDim / 32>(chunks32, [&](auto C) {
          key_scores<decltype(C)::value>(Qp + (t * H + kvh * G + h) * hd, Kc, n, hd, sc, scores.data() + h * padded);
        });
      float inv_sum[kMaxGroup];
      for (int64_t h = 0; h < G; ++h) {
        float* s = scores.data() + h * padded;
        __m512 mx = _mm512_set1_ps(-INFINITY);
        for (int64_t j = 0; j < padded; j += 16) mx = _mm512_max_ps(mx, _mm512_loadu_ps(s + j));
        const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
        __m512 sum = _mm512_setzero_ps();
        for (int64_t j = 0; j < padded; j += 16) {
          const __m512 p = exp_any(_mm512_sub_ps(_mm512_loadu_ps(s + j), m));  // -inf pads: exp(-87), alike in every call
          _mm512_storeu_ps(s + j, p);
          sum = _mm512_add_ps(sum, p);
        }
        inv_sum[h] = 1.0f / _mm512_reduce_add_ps(sum);
      }
      // out = p V / sum(p): heads and 16-lane chunks of the head in register blocks of 4 x 4
      for (int64_t h0 = 0; h0 < G; h0 += 4)
        for (int64_t c0 = 0; c0 < chunks; c0 += 4)
          with_count<4>(G - h0, [&](auto GB) {
            with_count<4>(chunks - c0, [&](auto CB) {
              weighted_values<decltype(GB)::value, decltype(CB)::value>(
                  scores.data() + h0 * padded, padded, inv_sum + h0, Vc, n, hd, c0,
                  Op + (t * H + kvh * G + h0) * hd);
            });
          });
    }
  });
  return out;
}

// ---- the decoder layer's elementwise parts, row by row ----------------------------------------
// Each replaces several small torch ops (a step of a small model is dispatch-bound); each row is
// computed on its own, in float32, rounded once to bfloat16.

inline void store_bf16(uint16_t* out, const float* v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = float_to_bf16(v[i]);
}

// rmsnorm of one row into `out`: bf16(x * rsqrt(mean(x^2) + eps) * w)
inline void rmsnorm_row(const float* x, const uint16_t* w, int64_t d, float eps, uint16_t* out) {
  __m512 sq = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= d; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    sq = _mm512_fmadd_ps(v, v, sq);
  }
  float total = _mm512_reduce_add_ps(sq);
  for (; i < d; ++i) total += x[i] * x[i];
  const float r = 1.0f / std::sqrt(total / static_cast<float>(d) + eps);
  for (int64_t j = 0; j < d; ++j) out[j] = float_to_bf16(x[j] * r * bf16_to_float_scalar(w[j]));
}

at::Tensor rows_rmsnorm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16 && x.is_contiguous(), "x: contiguous bfloat16 [T, d]");
  TORCH_CHECK(weight.scalar_type() == at::kBFloat16 && weight.is_contiguous() && weight.numel() == x.size(1),
              "weight: contiguous bfloat16 [d]");
  const int64_t T = x.size(0), d = x.size(1);
  at::Tensor out = at::empty_like(x);
  const auto* X = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
  const auto* W = reinterpret_cast<const uint16_t*>(weight.data_ptr<at::BFloat16>());
  auto* O = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  at::parallel_for(0, T, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> row(d);
    for (int64_t t = begin; t < end; ++t) {
      for (int64_t j = 0; j < d; ++j) row[j] = bf16_to_float_scalar(X[t * d + j]);
      rmsnorm_row(row.data(), W, d, static_cast<float>(eps), O + t * d);
    }
  });
  return out;
}

// (x + delta, rmsnorm(x + delta)): the residual add (rounded to bfloat16, as torch's add) and the next norm
std::tuple<at::Tensor, at::Tensor> rows_add_rmsnorm(const at::Tensor& x, const at::Tensor& delta,
                                                    const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16 && x.is_contiguous() && delta.sizes() == x.sizes() &&
                  delta.scalar_type() == at::kBFloat16 && delta.is_contiguous(),
              "x, delta: contiguous bfloat16 [T, d]");
  TORCH_CHECK(weight.scalar_type() == at::kBFloat16 && weight.is_contiguous() && weight.numel() == x.size(1),
              "weight: contiguous bfloat16 [d]");
  const int64_t T = x.size(0), d = x.size(1);
  at::Tensor sum = at::empty_like(x), out = at::empty_like(x);
  const auto* X = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
  const auto* D = reinterpret_cast<const uint16_t*>(delta.data_ptr<at::BFloat16>());
  const auto* W = reinterpret_cast<const uint16_t*>(weight.data_ptr<at::BFloat16>());
  auto* S = reinterpret_cast<uint16_t*>(sum.data_ptr<at::BFloat16>());
  auto* O = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  at::parallel_for(0, T, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> row(d);
    for (int64_t t = begin; t < end; ++t) {
      for (int64_t j = 0; j < d; ++j) {
        S[t * d + j] = float_to_bf16(bf16_to_float_scalar(X[t * d + j]) + bf16_to_float_scalar(D[t * d + j]));
        row[j] = bf16_to_float_scalar(S[t * d + j]);
      }
      rmsnorm_row(row.data(), W, d, static_cast<float>(eps), O + t * d);
    }
  });
  return {sum, out};
}


// silu(gate) * up for gate_up = [gate | up] [T, 2I]
at::Tensor rows_silu_mul(const at::Tensor& gate_up) {
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.scalar_type() == at::kBFloat16 && gate_up.is_contiguous() &&
                  gate_up.size(1) % 2 == 0,
              "gate_up: contiguous bfloat16 [T, 2I]");
  const int64_t T = gate_up.size(0), I = gate_up.size(1) / 2;
  at::Tensor out = at::empty({T, I}, gate_up.options());
  const auto* G = reinterpret_cast<const uint16_t*>(gate_up.data_ptr<at::BFloat16>());
  auto* O = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  at::parallel_for(0, T, 16, [&](int64_t begin, int64_t end) {
    float v[16];
    for (int64_t t = begin; t < end; ++t) {
      const uint16_t* g = G + t * 2 * I;
      const uint16_t* u = g + I;
      for (int64_t i = 0; i < I; i += 16) {
        const int64_t n = std::min<int64_t>(16, I - i);
        const __mmask16 m = static_cast<__mmask16>(n == 16 ? 0xFFFF : (1u << n) - 1);
        auto load = [&](const uint16_t* p) {
          return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
        };
        const __m512 gv = load(g + i), uv = load(u + i);
        const __m512 silu = _mm512_div_ps(gv, _mm512_add_ps(_mm512_set1_ps(1.0f), exp_any(_mm512_sub_ps(_mm512_setzero_ps(), gv))));
        _mm512_storeu_ps(v, _mm512_mul_ps(silu, uv));
        store_bf16(O + t * I + i, v, n);
      }
    }
  });
  return out;
}

// RoPE on q and k of the fused projection's rows (transformers' rotate_half layout, the tables in
// bfloat16 as the model holds them),
// k and v written to the cache at each row's slot and position; returns q [T, H, hd]
at::Tensor rows_rope_store(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& positions,
                           const at::Tensor& row_slot, const at::Tensor& kv, int64_t heads, int64_t kv_heads) {
  TORCH_CHECK(qkv.dim() == 2 && qkv.scalar_type() == at::kBFloat16 && qkv.is_contiguous(), "qkv: contiguous bfloat16 [T, (H + 2 KVH) hd]");
  TORCH_CHECK(kv.dim() == 5 && kv.scalar_type() == at::kBFloat16 && kv.is_contiguous() && kv.size(0) == 2 &&
                  kv.size(2) == kv_heads,
              "kv: one layer's contiguous bfloat16 cache [2, slots, kv_heads, max_len, hd]");
  const int64_t T = qkv.size(0), hd = kv.size(4), S = kv.size(1), L = kv.size(3), half = hd / 2;
  TORCH_CHECK(hd % 2 == 0 && qkv.size(1) == (heads + 2 * kv_heads) * hd, "qkv's width is not (H + 2 KVH) head_dim");
  TORCH_CHECK(cos.scalar_type() == at::kBFloat16 && sin.scalar_type() == at::kBFloat16 && cos.is_contiguous() &&
                  sin.is_contiguous() && cos.dim() == 2 && cos.size(1) == hd && sin.sizes() == cos.sizes(),
              "cos, sin: contiguous bfloat16 [positions, head_dim]");
  TORCH_CHECK(positions.scalar_type() == at::kLong && row_slot.scalar_type() == at::kLong && positions.numel() == T &&
                  row_slot.numel() == T && positions.is_contiguous() && row_slot.is_contiguous(),
              "positions, row_slot: contiguous int64 [T]");
  const auto* P = positions.data_ptr<int64_t>();
  const auto* SL = row_slot.data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t)
    TORCH_CHECK(P[t] >= 0 && P[t] < L && P[t] < cos.size(0) && SL[t] >= 0 && SL[t] < S, "row ", t, ": position or slot out of range");
  at::Tensor q = at::empty({T, heads, hd}, qkv.options());
  const auto* X = reinterpret_cast<const uint16_t*>(qkv.data_ptr<at::BFloat16>());
  const auto* C = reinterpret_cast<const uint16_t*>(cos.data_ptr<at::BFloat16>());
  const auto* Sn = reinterpret_cast<const uint16_t*>(sin.data_ptr<at::BFloat16>());
  auto* Q = reinterpret_cast<uint16_t*>(q.data_ptr<at::BFloat16>());
  auto* KV = reinterpret_cast<uint16_t*>(kv.data_ptr<at::BFloat16>());
  const int64_t width = (heads + 2 * kv_heads) * hd;
  at::parallel_for(0, T, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> rotated(hd);
    for (int64_t t = begin; t < end; ++t) {
      const uint16_t* c = C + P[t] * hd;
      const uint16_t* s = Sn + P[t] * hd;
      for (int64_t h = 0; h < heads + kv_heads; ++h) {
        const uint16_t* x = X + t * width + h * hd;
        for (int64_t i = 0; i < half; ++i) {
          const float a = bf16_to_float_scalar(x[i]), b = bf16_to_float_scalar(x[i + half]);
          rotated[i] = a * bf16_to_float_scalar(c[i]) - b * bf16_to_float_scalar(s[i]);
          rotated[i + half] = b * bf16_to_float_scalar(c[i + half]) + a * bf16_to_float_scalar(s[i + half]);
        }
        uint16_t* out = h < heads ? Q + (t * heads + h) * hd
                                  : KV + ((0 * S + SL[t]) * kv_heads + (h - heads)) * L * hd + P[t] * hd;
        store_bf16(out, rotated.data(), hd);
      }
      for (int64_t h = 0; h < kv_heads; ++h)
        std::memcpy(KV + ((1 * S + SL[t]) * kv_heads + h) * L * hd + P[t] * hd, X + t * width + (heads + kv_heads + h) * hd,
                    hd * sizeof(uint16_t));
    }
  });
  return q;
}

// The vanilla Markov head's sequential stage for greedy drafting, all gamma positions in one call:
// for request r and block position k, logits = base[r, k, :] + W2 W1[prev] (W2: the draft
// vocabulary's rows, float32 dot products of the bfloat16 embedding row), the token the first
// largest logit's (vocab[s] over a draft vocabulary), which is prev at k + 1 (the anchor at k = 0).
// Returns int64 [R, G] token ids.
at::Tensor markov_argmax_chain(const at::Tensor& base, const at::Tensor& w1, const at::Tensor& w2,
                               const at::Tensor& vocab, const at::Tensor& anchors) {
  TORCH_CHECK(base.dim() == 3 && base.scalar_type() == at::kFloat && base.is_contiguous(), "base: contiguous float32 [R, G, S]");
  TORCH_CHECK(w1.dim() == 2 && w1.scalar_type() == at::kBFloat16 && w1.is_contiguous(), "w1: contiguous bfloat16 [V, rank]");
  TORCH_CHECK(w2.dim() == 2 && w2.scalar_type() == at::kFloat && w2.is_contiguous() && w2.size(0) == base.size(2) &&
                  w2.size(1) == w1.size(1),
              "w2: contiguous float32 [S, rank]");
  TORCH_CHECK(vocab.scalar_type() == at::kLong && vocab.is_contiguous() && (vocab.numel() == 0 || vocab.numel() == base.size(2)),
              "vocab: int64 [S], or empty for the whole vocabulary");
  TORCH_CHECK(anchors.scalar_type() == at::kLong && anchors.is_contiguous() && anchors.numel() == base.size(0),
              "anchors: int64 [R]");
  const int64_t R = base.size(0), G = base.size(1), S = base.size(2), V = w1.size(0), rank = w1.size(1);
  TORCH_CHECK(S > 0 && (vocab.numel() > 0 || S == V), "an empty vocabulary, or base's width is not w1's rows");
  const auto* A = anchors.data_ptr<int64_t>();
  const auto* ids = vocab.numel() ? vocab.data_ptr<int64_t>() : nullptr;
  for (int64_t r = 0; r < R; ++r) TORCH_CHECK(A[r] >= 0 && A[r] < V, "anchor ", r, " out of range");
  for (int64_t s = 0; ids && s < S; ++s) TORCH_CHECK(ids[s] >= 0 && ids[s] < V, "vocab entry ", s, " out of range");
  at::Tensor out = at::empty({R, G}, anchors.options());
  const auto* B = base.data_ptr<float>();
  const auto* W1 = reinterpret_cast<const uint16_t*>(w1.data_ptr<at::BFloat16>());
  const auto* W2 = w2.data_ptr<float>();
  auto* O = out.data_ptr<int64_t>();
  at::parallel_for(0, R, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> e(rank);
    for (int64_t r = begin; r < end; ++r) {
      int64_t prev = A[r];
      for (int64_t k = 0; k < G; ++k) {
        for (int64_t j = 0; j < rank; ++j) e[j] = bf16_to_float_scalar(W1[prev * rank + j]);
        const float* logits = B + (r * G + k) * S;
        float best = -INFINITY;
        int64_t arg = 0;
        for (int64_t s = 0; s < S; ++s) {
          const float* w = W2 + s * rank;
          __m512 acc = _mm512_setzero_ps();
          int64_t j = 0;
          for (; j + 16 <= rank; j += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(w + j), _mm512_loadu_ps(e.data() + j), acc);
          float v = _mm512_reduce_add_ps(acc);
          for (; j < rank; ++j) v += w[j] * e[j];
          v += logits[s];
          if (v > best) { best = v; arg = s; }
        }
        prev = ids ? ids[arg] : arg;
        O[r * G + k] = prev;
      }
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(dspark_cpu_rows, m) {
  m.def("q4_rows_mm(Tensor x, Tensor qweight, Tensor scale_min) -> Tensor");
  m.def("q8_rows_mm(Tensor x, Tensor qweight, Tensor scale) -> Tensor");
  m.def("rows_rmsnorm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("rows_add_rmsnorm(Tensor x, Tensor delta, Tensor weight, float eps) -> (Tensor, Tensor)");
  m.def("rows_silu_mul(Tensor gate_up) -> Tensor");
  m.def("rows_rope_store(Tensor qkv, Tensor cos, Tensor sin, Tensor positions, Tensor row_slot, Tensor(a!) kv, int heads, int kv_heads) -> Tensor");
  m.def("rows_attention(Tensor q, Tensor kv, Tensor row_slot, Tensor row_keys, float scale) -> Tensor");
  m.def("markov_argmax_chain(Tensor base, Tensor w1, Tensor w2, Tensor vocab, Tensor anchors) -> Tensor");
}

TORCH_LIBRARY_IMPL(dspark_cpu_rows, CPU, m) {
  m.impl("q4_rows_mm", &q4_rows_mm);
  m.impl("q8_rows_mm", &q8_rows_mm);
  m.impl("rows_rmsnorm", &rows_rmsnorm);
  m.impl("rows_add_rmsnorm", &rows_add_rmsnorm);
  m.impl("rows_silu_mul", &rows_silu_mul);
  m.impl("rows_rope_store", &rows_rope_store);
  m.impl("rows_attention", &rows_attention);
  m.impl("markov_argmax_chain", &markov_argmax_chain);
}
