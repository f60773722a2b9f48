/* llama.cpp's CPU products on GGUF block weights, for pawfn's numerics="llamacpp" mode (x86 with AVX2 and FMA).

   The same arithmetic as blocks.py's torch emulation (which documents each rule and where it comes from): integer
   block products are exact, so any order gives them; every float step is written out as an explicit float32 FMA,
   multiply or add in the order ggml's kernels take it. Built with -ffp-contract=off so the compiler fuses nothing
   on its own. Each product function covers output features [first, last), so callers can split work across
   threads (ctypes releases the GIL). */

#include <immintrin.h>
#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include <cpuid.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static inline float f16_round(float value) { return _cvtsh_ss(_cvtss_sh(value, 0)); }

/* Eight f16 values (their bits) as float32, exactly. */
static inline __m256 load_f16(const uint16_t *x) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)x)); }

/* 32 floats times `scale`, rounded half to even and capped at 127 (values are within +-127.5 here), as int8. */
static inline void round_32(const float *x, __m256 scale, int8_t *codes) {
    __m256i parts[4];
    for (int j = 0; j < 4; ++j) {
        __m256 v = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * j), scale), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        parts[j] = _mm256_cvtps_epi32(_mm256_min_ps(v, _mm256_set1_ps(127.0f)));
    }
    __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(parts[0], parts[1]), _mm256_packs_epi32(parts[2], parts[3]));
    packed = _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)codes, packed);
}

static inline float largest_magnitude(const float *x, int count) {
    __m256 top = _mm256_setzero_ps();
    for (int j = 0; j < count; j += 8) top = _mm256_max_ps(top, _mm256_andnot_ps(_mm256_set1_ps(-0.0f), _mm256_loadu_ps(x + j)));
    __m128 four = _mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps(top, 1));
    four = _mm_max_ps(four, _mm_movehl_ps(four, four));
    return _mm_cvtss_f32(_mm_max_ss(four, _mm_movehdup_ps(four)));
}

/* Where a product's values go: `y[r * stride + o]` set to the value, or (accumulate) `y + value * alpha`, the
   product and the scaling rounded apart as torch's `y += product * alpha` does. Float products only (F32, F16, BF16):
   `bias` (NULL: none) added to each value set, rounded after the product as ggml_add adds it (the tower's biases,
   without a pass of their own over the outputs). */
typedef struct {
    float *y;
    int64_t stride;
    int32_t accumulate;
    float alpha;
    const float *bias;
} paw_out;

static inline void put(const paw_out *target, int64_t r, int64_t o, float value) {
    float *y = target->y + r * target->stride + o;
    *y = target->accumulate ? *y + value * target->alpha : target->bias ? value + target->bias[o] : value;
}

/* Q8_K: blocks of 256; the first value of largest magnitude maps to -127 (iscale = -127/it), codes
   round(iscale * x) capped at 127, scale 1/iscale; code sums per 16. */
void paw_quantize_q8_k(const float *x, int64_t rows, int64_t k, int8_t *codes, float *scales, int16_t *sums) {
    int64_t blocks = k / 256;
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t b = 0; b < blocks; ++b) {
            const float *v = x + r * k + b * 256;
            int8_t *q = codes + r * k + b * 256;
            int16_t *s = sums + (r * blocks + b) * 16;
            float largest = largest_magnitude(v, 256), signed_max = 0.0f;
            __m256 target = _mm256_set1_ps(largest);
            for (int j = 0; j < 256; j += 8) {  /* the first value of that magnitude */
                __m256 here = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), _mm256_loadu_ps(v + j));
                int found = _mm256_movemask_ps(_mm256_cmp_ps(here, target, _CMP_EQ_OQ));
                if (found) { signed_max = v[j + __builtin_ctz((unsigned)found)]; break; }
            }
            if (signed_max == 0.0f) {
                memset(q, 0, 256);
                memset(s, 0, 16 * sizeof(int16_t));
                scales[r * blocks + b] = 0.0f;
                continue;
            }
            float iscale = -127.0f / signed_max;
            for (int j = 0; j < 256; j += 32) round_32(v + j, _mm256_set1_ps(iscale), q + j);
            for (int j = 0; j < 256; j += 32) {  /* sums of each 16 codes: pairs, then fours, then the 16s */
                __m256i fours = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), _mm256_loadu_si256((const __m256i *)(q + j))),
                                                  _mm256_set1_epi16(1));
                __m256i sixteens = _mm256_hadd_epi32(_mm256_hadd_epi32(fours, fours), fours);
                s[j / 16] = (int16_t)_mm256_extract_epi32(sixteens, 0);
                s[j / 16 + 1] = (int16_t)_mm256_extract_epi32(sixteens, 4);
            }
            scales[r * blocks + b] = 1.0f / iscale;
        }
    }
}

/* Q8_0: blocks of 32; scale amax/127 stored as f16; codes round(x * (127/amax)). */
void paw_quantize_q8_0(const float *x, int64_t rows, int64_t k, int8_t *codes, float *scales) {
    int64_t blocks = k / 32;
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t b = 0; b < blocks; ++b) {
            const float *v = x + r * k + b * 32;
            float amax = largest_magnitude(v, 32);
            scales[r * blocks + b] = f16_round(amax / 127.0f);
            round_32(v, _mm256_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f), codes + r * k + b * 32);
        }
    }
}

/* A SIMD register's horizontal sum by halves: (l0+l4, .., l3+l7), then (a0+a2, a1+a3), then their sum. */
static inline float sum_halves(__m256 lanes) {
    __m128 four = _mm_add_ps(_mm256_castps256_ps128(lanes), _mm256_extractf128_ps(lanes, 1));
    __m128 two = _mm_add_ps(four, _mm_movehl_ps(four, four));
    return _mm_cvtss_f32(_mm_add_ss(two, _mm_movehdup_ps(two)));
}

/* Eight registers as a matrix of 8 x 8 floats, transposed in place: lane k of r[j] becomes lane j of r[k]. */
static inline void transpose_8x8(__m256 r[8]) {
    __m256 t[8];
    for (int k = 0; k < 8; k += 2) {
        t[k] = _mm256_unpacklo_ps(r[k], r[k + 1]);
        t[k + 1] = _mm256_unpackhi_ps(r[k], r[k + 1]);
    }
    for (int k = 0; k < 8; k += 4) {
        r[k] = _mm256_shuffle_ps(t[k], t[k + 2], 0x44);
        r[k + 1] = _mm256_shuffle_ps(t[k], t[k + 2], 0xEE);
        r[k + 2] = _mm256_shuffle_ps(t[k + 1], t[k + 3], 0x44);
        r[k + 3] = _mm256_shuffle_ps(t[k + 1], t[k + 3], 0xEE);
    }
    for (int k = 0; k < 4; ++k) {  /* r[k]: lane k of registers 0..3 (low half), lane k + 4 of them (high); r[k + 4]: of 4..7 */
        t[k] = _mm256_permute2f128_ps(r[k], r[k + 4], 0x20);
        t[k + 4] = _mm256_permute2f128_ps(r[k], r[k + 4], 0x31);
    }
    for (int k = 0; k < 8; ++k) r[k] = t[k];
}

static inline int32_t sum_ints(__m256i lanes) {
    __m128i four = _mm_add_epi32(_mm256_castsi256_si128(lanes), _mm256_extracti128_si256(lanes, 1));
    __m128i two = _mm_add_epi32(four, _mm_unpackhi_epi64(four, four));
    return _mm_cvtsi128_si32(_mm_add_epi32(two, _mm_shuffle_epi32(two, 1)));
}

/* One Q6_K block (unsigned codes 0..63 `w`, sub-block scales `sub`) times one Q8_K block (`x`, code sums `sums`):
   the 8 int32 lanes of the one-row kernel, lane L holding offsets 4L..4L+3 of each run of 32, less
   32 * (sums[2L] * sub[2L] + sums[2L+1] * sub[2L+1]). */
static inline __m256i q6_k_lanes(const uint8_t *w, const int8_t *sub, const int8_t *x, const int16_t *sums) {
    __m256i lanes = _mm256_setzero_si256();
    __m256i sub16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sub));  /* int32 r = (sub[2r], sub[2r+1]) */
    /* int16 sub[2r] in the low 128 bits, sub[2r+1] in the high: the run's two sub-blocks of 16 */
    const __m256i spread = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,
                                            2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
    for (int run = 0; run < 8; ++run) {
        __m256i pairs = _mm256_maddubs_epi16(_mm256_loadu_si256((const __m256i *)(w + run * 32)),
                                             _mm256_loadu_si256((const __m256i *)(x + run * 32)));
        __m256i scale = _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(sub16, _mm256_set1_epi32(run)), spread);
        lanes = _mm256_add_epi32(lanes, _mm256_madd_epi16(pairs, scale));
    }
    __m256i offsets = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)sums), sub16);
    return _mm256_sub_epi32(lanes, _mm256_slli_epi32(offsets, 5));
}

/* Rows taken together by the one-row and tiled Q6_K kernels: each weight block is unpacked once for all of them. */
#define ROW_GROUP 8

/* One Q6_K block's codes from its 192 bytes of low nibbles and high bit pairs (llama.cpp's `ql`, `qh`: the codes are
   kept so, 25% fewer bytes to stream per product than one byte a code), unsigned 0..63 in element order. */
static inline void q6_k_unpack(const uint8_t *q, uint8_t *codes) {
    const __m256i nibble = _mm256_set1_epi8(15), pair = _mm256_set1_epi8(3);
    for (int half = 0; half < 2; ++half) {
        __m256i l0 = _mm256_loadu_si256((const __m256i *)(q + 64 * half));
        __m256i l1 = _mm256_loadu_si256((const __m256i *)(q + 64 * half + 32));
        __m256i h = _mm256_loadu_si256((const __m256i *)(q + 128 + 32 * half));
        __m256i *out = (__m256i *)(codes + 128 * half);
        /* 16-bit shifts, each byte then masked: no bit of the neighbouring byte survives */
        _mm256_storeu_si256(out, _mm256_or_si256(_mm256_and_si256(l0, nibble), _mm256_slli_epi16(_mm256_and_si256(h, pair), 4)));
        _mm256_storeu_si256(out + 1, _mm256_or_si256(_mm256_and_si256(l1, nibble),
                                                     _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2), pair), 4)));
        _mm256_storeu_si256(out + 2, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), nibble),
                                                     _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 4), pair), 4)));
        _mm256_storeu_si256(out + 3, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), nibble),
                                                     _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 6), pair), 4)));
    }
}

/* `ggml_vec_dot_q6_K_q8_K` for every input row and outputs [first, last): per lane `fma(d_x * d_w, lane, acc)`
   over the blocks, then the lanes by halves. w holds 192-byte packed blocks; y is [rows, out]. */
static void q6_k_rows(const uint8_t *w, const int8_t *sub, const float *w_scale, const int8_t *x, const float *x_scale,
                      const int16_t *sums, const paw_out *y, int64_t blocks, int64_t rows, int64_t first, int64_t last) {
    uint8_t codes[256] __attribute__((aligned(32)));
    for (int64_t o = first; o < last; ++o) {
        for (int64_t r0 = 0; r0 < rows; r0 += ROW_GROUP) {
            int count = rows - r0 < ROW_GROUP ? (int)(rows - r0) : ROW_GROUP;
            __m256 acc[ROW_GROUP];
            for (int i = 0; i < count; ++i) acc[i] = _mm256_setzero_ps();
            for (int64_t b = 0; b < blocks; ++b) {
                q6_k_unpack(w + (o * blocks + b) * 192, codes);
                for (int i = 0; i < count; ++i) {
                    int64_t r = r0 + i;
                    __m256i lanes = q6_k_lanes(codes, sub + (o * blocks + b) * 16, x + (r * blocks + b) * 256,
                                               sums + (r * blocks + b) * 16);
                    __m256 d = _mm256_set1_ps(x_scale[r * blocks + b] * w_scale[o * blocks + b]);
                    acc[i] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(lanes), acc[i]);
                }
            }
            for (int i = 0; i < count; ++i) put(y, r0 + i, o, sum_halves(acc[i]));
        }
    }
}

#define AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")))

/* 1 where the CPU has AVX-512 F/BW/DQ/VL and VNNI: the one-row Q6_K kernel then takes 64 codes a step. */
static int has_avx512_vnni(void) {
#ifdef PAW_BASELINE
    return 0;
#endif
    static int known = -1;
    if (known < 0) {
        __builtin_cpu_init();
        known = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
                __builtin_cpu_supports("avx512vnni");
    }
    return known;
}

static int avx512_allowed = 1;

/* Whether the AVX-512 VNNI kernels run: the CPU has them and `paw_use_avx512` has not turned them off. */
static inline int avx512_on(void) { return avx512_allowed && has_avx512_vnni(); }

/* Let the AVX-512 kernels run (1, the default) or not (0: the AVX2 ones, as on CPUs without AVX-512); returns
   whether they now run. For tests of both on one machine. */
int paw_use_avx512(int allowed) {
    avx512_allowed = allowed;
    return avx512_on();
}

#ifndef PAW_BASELINE  /* kernels for instruction sets an older compiler may not know (built again without) */

/* q6_k_unpack into four registers of 64 codes. */
AVX512_TARGET static inline void q6_k_unpack_512(const uint8_t *q, __m512i codes[4]) {
    const __m512i nibble = _mm512_set1_epi8(15), pair = _mm512_set1_epi8(3);
    for (int half = 0; half < 2; ++half) {
        __m512i low = _mm512_loadu_si512(q + 64 * half);  /* ql: codes 0..63 in the low nibbles, 64..127 high */
        __m256i h = _mm256_loadu_si256((const __m256i *)(q + 128 + 32 * half));
        __m512i high = _mm512_inserti64x4(_mm512_castsi256_si512(h), _mm256_srli_epi16(h, 2), 1);
        codes[2 * half] = _mm512_or_si512(_mm512_and_si512(low, nibble), _mm512_slli_epi16(_mm512_and_si512(high, pair), 4));
        codes[2 * half + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(low, 4), nibble),
                                              _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(high, 4), pair), 4));
    }
}

/* q6_k_rows on AVX-512: 64 codes a step (two runs of 32), pairs weighted by their sub-block scales with vpdpwssd;
   lanes 8..15 (the second run's) then fold onto 0..7. Integer sums, so the very same lanes. */
AVX512_TARGET static void q6_k_rows_512(const uint8_t *w, const int8_t *sub, const float *w_scale, const int8_t *x,
                                        const float *x_scale, const int16_t *sums, const paw_out *y, int64_t blocks,
                                        int64_t rows, int64_t first, int64_t last) {
    /* pair k of step c (codes 64c + 2k, +1) lies in sub-block 4c + k / 8 */
    const __m512i spread = _mm512_set_epi16(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2,
                                            1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    for (int64_t o = first; o < last; ++o) {
        for (int64_t r0 = 0; r0 < rows; r0 += ROW_GROUP) {
            int count = rows - r0 < ROW_GROUP ? (int)(rows - r0) : ROW_GROUP;
            __m256 acc[ROW_GROUP];
            for (int i = 0; i < count; ++i) acc[i] = _mm256_setzero_ps();
            for (int64_t b = 0; b < blocks; ++b) {
                __m512i codes[4], scale[4];
                q6_k_unpack_512(w + (o * blocks + b) * 192, codes);
                __m256i sub16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(sub + (o * blocks + b) * 16)));
                for (int step = 0; step < 4; ++step)
                    scale[step] = _mm512_permutexvar_epi16(_mm512_add_epi16(spread, _mm512_set1_epi16((short)(4 * step))),
                                                           _mm512_castsi256_si512(sub16));
                for (int i = 0; i < count; ++i) {
                    int64_t r = r0 + i;
                    const int8_t *xb = x + (r * blocks + b) * 256;
                    __m512i lanes = _mm512_setzero_si512();
                    for (int step = 0; step < 4; ++step)
                        lanes = _mm512_dpwssd_epi32(lanes, _mm512_maddubs_epi16(codes[step], _mm512_loadu_si512(xb + 64 * step)),
                                                    scale[step]);
                    __m256i folded = _mm256_add_epi32(_mm512_castsi512_si256(lanes), _mm512_extracti64x4_epi64(lanes, 1));
                    __m256i offsets = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(sums + (r * blocks + b) * 16)), sub16);
                    folded = _mm256_sub_epi32(folded, _mm256_slli_epi32(offsets, 5));
                    __m256 d = _mm256_set1_ps(x_scale[r * blocks + b] * w_scale[o * blocks + b]);
                    acc[i] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(folded), acc[i]);
                }
            }
            for (int i = 0; i < count; ++i) put(y, r0 + i, o, sum_halves(acc[i]));
        }
    }
}

/* q6_k_tiled on AVX-512 VNNI with the rows in lanes: for `NO` outputs at once and sixteen rows, each sub-block's sum
   of 16 products is four vpdpbusd steps of the rows' unsigned codes (xu = x + 128, laid out `xq` [group of 16 rows]
   [block][quad of codes][row][4]) against one broadcast quad of the output's signed codes (c - 32), then weighted by
   its sub-block scale. The offset 128 * sum((c - 32) * sub) is the weights' alone, one integer per block. The sums
   are the exact integers s of q6_k_tiled (any order), and `acc = fma(float(s) * d_w, d_x, acc)` runs on sixteen
   rows' lanes, each rounded as the scalar steps are. x_scale_t: the rows' block scales as [blocks][padded rows]. */
AVX512_TARGET static inline __attribute__((always_inline)) void q6_k_outputs_16(
    const uint8_t *w, const int8_t *sub, const float *w_scale, const uint8_t *xq, const float *x_scale_t, const paw_out *y,
    int64_t blocks, int64_t rows, int64_t o0, const int NO, __m512 *acc) {
    __m512i pick[2];
    {
        int16_t index[2][32];
        for (int p = 0; p < 2; ++p)
            for (int e = 0; e < 32; ++e) index[p][e] = (int16_t)(8 * p + 4 * ((e % 8) >= 4) + e / 8);
        pick[0] = _mm512_loadu_si512(index[0]);
        pick[1] = _mm512_loadu_si512(index[1]);
    }
    const __m512i bias = _mm512_set1_epi8(32), ones = _mm512_set1_epi8(1), zero = _mm512_setzero_si512();
    const int64_t groups = (rows + 15) / 16, padded = groups * 16;
    int32_t quads[4][64] __attribute__((aligned(64)));  /* the outputs' signed codes of a block, four to an int32 */
    int32_t scales[4][16] __attribute__((aligned(64)));  /* their sub-block scales */
    for (int64_t i = 0; i < NO * groups; ++i) acc[i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < blocks; ++b) {
        int32_t correction[4];
        for (int i = 0; i < NO; ++i) {
            const int64_t block = (o0 + i) * blocks + b;
            __m512i codes[4], scale[2];
            q6_k_unpack_512(w + block * 192, codes);
            for (int step = 0; step < 4; ++step) {
                codes[step] = _mm512_sub_epi8(codes[step], bias);
                _mm512_store_si512(quads[i] + 16 * step, codes[step]);
            }
            const __m128i sub8 = _mm_loadu_si128((const __m128i *)(sub + block * 16));
            _mm512_store_si512(scales[i], _mm512_cvtepi8_epi32(sub8));
            __m512i sub16 = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(sub8));
            scale[0] = _mm512_permutexvar_epi16(pick[0], sub16);
            scale[1] = _mm512_permutexvar_epi16(pick[1], sub16);
            __m512i offset = _mm512_dpwssd_epi32(zero, _mm512_packs_epi32(_mm512_dpbusd_epi32(zero, ones, codes[0]),
                                                                          _mm512_dpbusd_epi32(zero, ones, codes[1])), scale[0]);
            offset = _mm512_dpwssd_epi32(offset, _mm512_packs_epi32(_mm512_dpbusd_epi32(zero, ones, codes[2]),
                                                                    _mm512_dpbusd_epi32(zero, ones, codes[3])), scale[1]);
            correction[i] = 128 * _mm512_reduce_add_epi32(offset);
        }
        for (int64_t g = 0; g < groups; ++g) {
            const uint8_t *xb = xq + (g * blocks + b) * 4096;
            __m512i total[4];
            for (int i = 0; i < NO; ++i) total[i] = _mm512_set1_epi32(-correction[i]);
            for (int j = 0; j < 16; ++j) {
                __m512i part[4];
                for (int i = 0; i < NO; ++i) part[i] = zero;
                for (int t = 0; t < 4; ++t) {
                    const __m512i rows_quad = _mm512_load_si512(xb + (4 * j + t) * 64);
                    for (int i = 0; i < NO; ++i) part[i] = _mm512_dpbusd_epi32(part[i], rows_quad, _mm512_set1_epi32(quads[i][4 * j + t]));
                }
                for (int i = 0; i < NO; ++i) total[i] = _mm512_add_epi32(total[i], _mm512_mullo_epi32(part[i], _mm512_set1_epi32(scales[i][j])));
            }
            const __m512 dx = _mm512_load_ps(x_scale_t + b * padded + g * 16);
            for (int i = 0; i < NO; ++i) {
                const __m512 s = _mm512_mul_ps(_mm512_cvtepi32_ps(total[i]), _mm512_set1_ps(w_scale[(o0 + i) * blocks + b]));
                acc[i * groups + g] = _mm512_fmadd_ps(s, dx, acc[i * groups + g]);
            }
        }
    }
    for (int64_t g = 0; g < groups; ++g) {
        if (NO < 4) {
            float values[16];
            _mm512_storeu_ps(values, acc[g]);
            for (int l = 0; l < 16 && g * 16 + l < rows; ++l) put(y, g * 16 + l, o0, values[l]);
            continue;
        }
        /* four outputs' sixteen rows as sixteen rows of four: 128-bit chunk c of by_row[k] is row 4c + k */
        __m512 low = _mm512_unpacklo_ps(acc[g], acc[groups + g]), high = _mm512_unpackhi_ps(acc[g], acc[groups + g]);
        __m512 low2 = _mm512_unpacklo_ps(acc[2 * groups + g], acc[3 * groups + g]);
        __m512 high2 = _mm512_unpackhi_ps(acc[2 * groups + g], acc[3 * groups + g]);
        __m512 by_row[4] = {
            _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(low), _mm512_castps_pd(low2))),
            _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(low), _mm512_castps_pd(low2))),
            _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(high), _mm512_castps_pd(high2))),
            _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(high), _mm512_castps_pd(high2))),
        };
        float values[4][16];
        for (int k = 0; k < 4; ++k) _mm512_storeu_ps(values[k], by_row[k]);
        for (int l = 0; l < 16 && g * 16 + l < rows; ++l) {
            __m128 v = _mm_loadu_ps(values[l % 4] + 4 * (l / 4));
            float *target = y->y + (g * 16 + l) * y->stride + o0;
            if (y->accumulate) v = _mm_add_ps(_mm_loadu_ps(target), _mm_mul_ps(v, _mm_set1_ps(y->alpha)));
            _mm_storeu_ps(target, v);
        }
    }
}

/* q6_k_outputs_16 over outputs [first, last), four at a time (each x quad loaded once for four outputs). */
AVX512_TARGET static void q6_k_tiled_512(const uint8_t *w, const int8_t *sub, const float *w_scale, const uint8_t *xq,
                                         const float *x_scale_t, const paw_out *y, int64_t blocks, int64_t rows,
                                         int64_t first, int64_t last) {
    __m512 *acc = aligned_alloc(64, (size_t)(4 * ((rows + 15) / 16)) * sizeof(__m512));
    if (acc == NULL) return;
    int64_t o = first;
    for (; o + 4 <= last; o += 4) q6_k_outputs_16(w, sub, w_scale, xq, x_scale_t, y, blocks, rows, o, 4, acc);
    for (; o < last; ++o) q6_k_outputs_16(w, sub, w_scale, xq, x_scale_t, y, blocks, rows, o, 1, acc);
    free(acc);
}

#endif

/* ggml's tiled K-quant kernel (8 rows or more): per block the exact integer sum s, then
   `acc = fma(float(s) * d_w, d_x, acc)` over the blocks in order. */
static void q6_k_tiled(const uint8_t *w, const int8_t *sub, const float *w_scale, const int8_t *x, const float *x_scale,
                       const int16_t *sums, const paw_out *y, int64_t blocks, int64_t rows, int64_t first, int64_t last) {
    uint8_t codes[256] __attribute__((aligned(32)));
    for (int64_t o = first; o < last; ++o) {
        for (int64_t r0 = 0; r0 < rows; r0 += ROW_GROUP) {
            int count = rows - r0 < ROW_GROUP ? (int)(rows - r0) : ROW_GROUP;
            float acc[ROW_GROUP] = {0};
            for (int64_t b = 0; b < blocks; ++b) {
                q6_k_unpack(w + (o * blocks + b) * 192, codes);
                for (int i = 0; i < count; ++i) {
                    int64_t r = r0 + i;
                    int32_t s = sum_ints(q6_k_lanes(codes, sub + (o * blocks + b) * 16, x + (r * blocks + b) * 256,
                                                    sums + (r * blocks + b) * 16));
                    acc[i] = fmaf((float)s * w_scale[o * blocks + b], x_scale[r * blocks + b], acc[i]);
                }
            }
            for (int i = 0; i < count; ++i) put(y, r0 + i, o, acc[i]);
        }
    }
}

/* One Q4_0/Q8_0 block (32 int8 codes) times one Q8_0 block: 8 int32 lanes of 4 consecutive products. */
static inline __m256i q0_lanes(const int8_t *w, const int8_t *x) {
    __m256i wv = _mm256_loadu_si256((const __m256i *)w), xv = _mm256_loadu_si256((const __m256i *)x);
    __m256i pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv));
    return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
}

/* `ggml_vec_dot_q4_0_q8_0` / `_q8_0_q8_0` (and tinyBLAS, the same steps): per lane `fma(d_x * d_w, lane, acc)`,
   then the lanes by halves. */
static void q0_rows(const int8_t *w, const float *w_scale, const int8_t *x, const float *x_scale, const paw_out *y,
                    int64_t blocks, int64_t rows, int64_t first, int64_t last) {
    for (int64_t o = first; o < last; ++o) {
        for (int64_t r = 0; r < rows; ++r) {
            __m256 acc = _mm256_setzero_ps();
            for (int64_t b = 0; b < blocks; ++b) {
                __m256i lanes = q0_lanes(w + (o * blocks + b) * 32, x + (r * blocks + b) * 32);
                __m256 d = _mm256_set1_ps(x_scale[r * blocks + b] * w_scale[o * blocks + b]);
                acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(lanes), acc);
            }
            put(y, r, o, sum_halves(acc));
        }
    }
}

/* q0_rows eight outputs at a time, from codes grouped by eights, `eights[g][b][l][j][e] = w[8g + j][32b + 4l + e]`,
   and scales `scales[g][b][j] = d_w[8g + j][b]`: each output's 8 lanes accumulate fma(d_x * d_w, lane, acc) over the
   blocks and are summed by halves, exactly as q0_rows rounds them; [first, last) counts groups of eight. */
static void q0_eights(const int8_t *eights, const uint16_t *scales, const int8_t *x, const float *x_scale, const paw_out *y,
                      int64_t blocks, int64_t rows, int64_t first, int64_t last, int nibbles) {
    const __m256i ones = _mm256_set1_epi16(1), ones8 = _mm256_set1_epi8(1), low4 = _mm256_set1_epi8(15);
    for (int64_t r = 0; r < rows; ++r) {
        float *row = y->y + r * y->stride;
        for (int64_t g = first; g < last; ++g) {
            __m256 acc[8];
            for (int l = 0; l < 8; ++l) acc[l] = _mm256_setzero_ps();
            for (int64_t b = 0; b < blocks; ++b) {
                int32_t quads[8];
                memcpy(quads, x + (r * blocks + b) * 32, 32);
                __m256 d = _mm256_mul_ps(_mm256_set1_ps(x_scale[r * blocks + b]), load_f16(scales + (g * blocks + b) * 8));
                if (nibbles) {
                    /* Q4_0 as nibbles n = code + 8, lanes 2p and 2p + 1 in the low and high halves of 32 bytes p:
                       sum(n * x) - 8 * sum(x) per lane, the very integers of the signed codes */
                    __m256i xb = _mm256_loadu_si256((const __m256i *)(x + (r * blocks + b) * 32));
                    int32_t quad_sums[8];
                    _mm256_storeu_si256((__m256i *)quad_sums, _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, xb), ones));
                    const uint8_t *w = (const uint8_t *)eights + (g * blocks + b) * 128;
                    for (int p = 0; p < 4; ++p) {
                        __m256i v = _mm256_loadu_si256((const __m256i *)(w + 32 * p));
                        __m256i halves[2] = {_mm256_and_si256(v, low4), _mm256_and_si256(_mm256_srli_epi16(v, 4), low4)};
                        for (int h = 0; h < 2; ++h) {
                            int l = 2 * p + h;
                            __m256i lanes = _mm256_madd_epi16(_mm256_maddubs_epi16(halves[h], _mm256_set1_epi32(quads[l])), ones);
                            lanes = _mm256_sub_epi32(lanes, _mm256_set1_epi32(8 * quad_sums[l]));
                            acc[l] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(lanes), acc[l]);
                        }
                    }
                    continue;
                }
                const int8_t *w = eights + (g * blocks + b) * 256;
                for (int l = 0; l < 8; ++l) {
                    __m256i wv = _mm256_loadu_si256((const __m256i *)(w + l * 32));
                    __m256i xv = _mm256_set1_epi32(quads[l]);
                    __m256i lanes = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv)), ones);
                    acc[l] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(lanes), acc[l]);
                }
            }
            __m256 a0 = _mm256_add_ps(acc[0], acc[4]), a1 = _mm256_add_ps(acc[1], acc[5]);
            __m256 a2 = _mm256_add_ps(acc[2], acc[6]), a3 = _mm256_add_ps(acc[3], acc[7]);
            __m256 value = _mm256_add_ps(_mm256_add_ps(a0, a2), _mm256_add_ps(a1, a3));
            float *target = row + 8 * g;
            if (y->accumulate)
                value = _mm256_add_ps(_mm256_loadu_ps(target), _mm256_mul_ps(value, _mm256_set1_ps(y->alpha)));
            _mm256_storeu_ps(target, value);
        }
    }
}

#ifndef PAW_BASELINE

/* q0_eights on AVX-512 VNNI: two lanes of eight outputs a step (64 codes), their products summed exactly by
   vpdpbusd on the codes made unsigned (+128), less 128 times the row's quad sums (the start value), so the same
   integer lanes; per lane fma(d_x * d_w, lane, acc), then the lanes by halves as q0_eights does. A row's x quads and
   their corrections are laid out once per row ([blocks][4 steps] x 64 bytes each). */
AVX512_TARGET static void q0_eights_512(const int8_t *eights, const uint16_t *scales, const int8_t *x, const float *x_scale,
                                        const paw_out *y, int64_t blocks, int64_t rows, int64_t first, int64_t last, int nibbles) {
    __m512i *quads = aligned_alloc(64, (size_t)blocks * 8 * sizeof(__m512i));
    if (quads == NULL) {  /* no memory for the row layout: the AVX2 kernel needs none */
        q0_eights(eights, scales, x, x_scale, y, blocks, rows, first, last, nibbles);
        return;
    }
    __m512i *starts = quads + blocks * 4;
    /* dword lanes 0..7 take quad 2s, lanes 8..15 quad 2s + 1 */
    const __m512i pick = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i flip = _mm512_set1_epi8((char)0x80), ones = _mm512_set1_epi8(1);
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t b = 0; b < blocks; ++b) {
            __m512i block = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(x + (r * blocks + b) * 32)));
            /* -128 (the codes made unsigned) or -8 (nibbles) times the quad's sum of codes, per dword */
            __m512i sums = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, block);
            __m512i negated = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sums, nibbles ? 3 : 7));
            for (int step = 0; step < 4; ++step) {
                __m512i index = _mm512_add_epi32(pick, _mm512_set1_epi32(2 * step));
                quads[b * 4 + step] = _mm512_permutexvar_epi32(index, block);
                starts[b * 4 + step] = _mm512_permutexvar_epi32(index, negated);
            }
        }
        float *row = y->y + r * y->stride;
        for (int64_t g = first; g < last; ++g) {
            __m512 acc[4];
            for (int step = 0; step < 4; ++step) acc[step] = _mm512_setzero_ps();
            for (int64_t b = 0; b < blocks; ++b) {
                __m256 d8 = _mm256_mul_ps(_mm256_set1_ps(x_scale[r * blocks + b]), load_f16(scales + (g * blocks + b) * 8));
                __m512 d = _mm512_insertf32x8(_mm512_castps256_ps512(d8), d8, 1);
                const int8_t *w = eights + (g * blocks + b) * (nibbles ? 128 : 256);
                for (int step = 0; step < 4; ++step) {
                    __m512i codes;
                    if (nibbles) {  /* lanes 2s and 2s + 1: the low and high nibbles of 32 bytes */
                        __m256i v = _mm256_loadu_si256((const __m256i *)(w + 32 * step)), low4 = _mm256_set1_epi8(15);
                        codes = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(v, low4)),
                                                   _mm256_and_si256(_mm256_srli_epi16(v, 4), low4), 1);
                    } else {
                        codes = _mm512_xor_si512(_mm512_loadu_si512(w + 64 * step), flip);
                    }
                    __m512i lanes = _mm512_dpbusd_epi32(starts[b * 4 + step], codes, quads[b * 4 + step]);
                    acc[step] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(lanes), acc[step]);
                }
            }
            /* acc[s] holds lanes 2s and 2s + 1: (l0 + l4, l1 + l5) + (l2 + l6, l3 + l7), then the two halves */
            __m512 pairs = _mm512_add_ps(_mm512_add_ps(acc[0], acc[2]), _mm512_add_ps(acc[1], acc[3]));
            __m256 value = _mm256_add_ps(_mm512_castps512_ps256(pairs), _mm512_extractf32x8_ps(pairs, 1));
            float *target = row + 8 * g;
            if (y->accumulate)
                value = _mm256_add_ps(_mm256_loadu_ps(target), _mm256_mul_ps(value, _mm256_set1_ps(y->alpha)));
            _mm256_storeu_ps(target, value);
        }
    }
    free(quads);
}


#define LANES_CHUNK 16  /* blocks whose rows' codes and outputs' quads (512 bytes each per block) stay in L1 for eight outputs */

/* q0_eights on AVX-512 VNNI with the rows in lanes (sixteen rows a register; prompts): per block, output and lane l
   (products 4l..4l+3), one vpdpbusd of the rows' unsigned codes (xq, laid out by `prepare_rows`) against the
   output's broadcast signed quad, started at -128 times the quad's sum (so the exact integer of the signed codes),
   then `acc = fma(d_x * d_w, lane, acc)` on sixteen rows at once, and the eight lanes summed by halves: each row's
   numbers exactly those of q0_rows. x_scale_t: the rows' block scales as [blocks][padded rows]. */
AVX512_TARGET static void q0_eights_lanes_512(const int8_t *eights, const uint16_t *scales, const uint8_t *xq, const float *x_scale_t,
                                              const paw_out *y, int64_t blocks, int64_t rows, int64_t first, int64_t last, int nibbles) {
    const int64_t groups = (rows + 15) / 16, padded = groups * 16;
    int32_t *quads = aligned_alloc(64, (size_t)(blocks * 64 * 2) * sizeof(int32_t));  /* [block][lane][output], then starts */
    float *w_scale = malloc((size_t)(blocks * 8) * sizeof(float));
    if (quads == NULL || w_scale == NULL) goto done;
    int32_t *starts = quads + blocks * 64;
    const __m512i ones = _mm512_set1_epi8(1);
    for (int64_t g = first; g < last; ++g) {
        for (int64_t b = 0; b < blocks; ++b) {  /* the eight outputs' signed quads [lane][output] and their starts */
            int8_t *codes = (int8_t *)(quads + b * 64);
            if (nibbles) {  /* lanes 2p and 2p + 1: the low and high nibbles of 32 bytes p, each code + 8 */
                const uint8_t *w = (const uint8_t *)eights + (g * blocks + b) * 128;
                const __m256i low4 = _mm256_set1_epi8(15), eight = _mm256_set1_epi8(8);
                for (int p = 0; p < 4; ++p) {
                    __m256i v = _mm256_loadu_si256((const __m256i *)(w + 32 * p));
                    _mm256_storeu_si256((__m256i *)(codes + 64 * p), _mm256_sub_epi8(_mm256_and_si256(v, low4), eight));
                    _mm256_storeu_si256((__m256i *)(codes + 64 * p + 32), _mm256_sub_epi8(_mm256_and_si256(_mm256_srli_epi16(v, 4), low4), eight));
                }
            } else {  /* already [lane][output][4] */
                memcpy(codes, eights + (g * blocks + b) * 256, 256);
            }
            for (int k = 0; k < 4; ++k) {
                __m512i sums = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, _mm512_loadu_si512(quads + b * 64 + 16 * k));
                _mm512_storeu_si512(starts + b * 64 + 16 * k, _mm512_mullo_epi32(sums, _mm512_set1_epi32(-128)));
            }
            for (int j = 0; j < 8; ++j) w_scale[b * 8 + j] = _cvtsh_ss(scales[(g * blocks + b) * 8 + j]);
        }
        for (int64_t r0 = 0; r0 < groups; ++r0) {
            __m256 by_output[2][8];  /* [rows 0..7 or 8..15][output]: each output's eight rows */
            /* the blocks a chunk at a time, each output's lanes kept between chunks: a chunk's row codes and quads
               (16 KB) are read from L1 by all eight outputs (a whole row's did not fit from 1024 wide on: a
               3072-wide product took 1.7x as long); each lane's FMAs stay in block order */
            __m512 kept[8][8];
            for (int64_t b0 = 0; b0 < blocks; b0 += LANES_CHUNK) {
                const int64_t b1 = b0 + LANES_CHUNK < blocks ? b0 + LANES_CHUNK : blocks;
                /* two outputs at once: each row-code load feeds two vpdpbusd (one load a product pair, not one) */
                for (int j = 0; j < 8; j += 2) {
                    __m512 acc[2][8];
                    for (int k = 0; k < 2; ++k)
                        for (int l = 0; l < 8; ++l) acc[k][l] = b0 == 0 ? _mm512_setzero_ps() : kept[j + k][l];
                    for (int64_t b = b0; b < b1; ++b) {
                        const __m512 dx = _mm512_load_ps(x_scale_t + b * padded + r0 * 16);
                        const __m512 d0 = _mm512_mul_ps(dx, _mm512_set1_ps(w_scale[b * 8 + j]));
                        const __m512 d1 = _mm512_mul_ps(dx, _mm512_set1_ps(w_scale[b * 8 + j + 1]));
                        const uint8_t *xb = xq + (r0 * blocks + b) * 512;
                        const int32_t *quad = quads + b * 64 + j, *start = starts + b * 64 + j;
                        for (int l = 0; l < 8; ++l) {
                            const __m512i codes = _mm512_load_si512(xb + 64 * l);
                            __m512i lane0 = _mm512_dpbusd_epi32(_mm512_set1_epi32(start[8 * l]), codes, _mm512_set1_epi32(quad[8 * l]));
                            __m512i lane1 = _mm512_dpbusd_epi32(_mm512_set1_epi32(start[8 * l + 1]), codes, _mm512_set1_epi32(quad[8 * l + 1]));
                            acc[0][l] = _mm512_fmadd_ps(d0, _mm512_cvtepi32_ps(lane0), acc[0][l]);
                            acc[1][l] = _mm512_fmadd_ps(d1, _mm512_cvtepi32_ps(lane1), acc[1][l]);
                        }
                    }
                    for (int k = 0; k < 2; ++k) {
                        __m512 *lanes = acc[k];
                        if (b1 < blocks) {
                            for (int l = 0; l < 8; ++l) kept[j + k][l] = lanes[l];
                            continue;
                        }
                        /* by halves: (l0 + l4) + (l2 + l6), then (l1 + l5) + (l3 + l7), then their sum */
                        __m512 even = _mm512_add_ps(_mm512_add_ps(lanes[0], lanes[4]), _mm512_add_ps(lanes[2], lanes[6]));
                        __m512 odd = _mm512_add_ps(_mm512_add_ps(lanes[1], lanes[5]), _mm512_add_ps(lanes[3], lanes[7]));
                        __m512 total = _mm512_add_ps(even, odd);
                        by_output[0][j + k] = _mm512_castps512_ps256(total);
                        by_output[1][j + k] = _mm512_extractf32x8_ps(total, 1);
                    }
                }
            }
            for (int half = 0; half < 2; ++half) {
                transpose_8x8(by_output[half]);  /* now [row][output] */
                for (int l = 0; l < 8 && r0 * 16 + 8 * half + l < rows; ++l) {
                    float *target = y->y + (r0 * 16 + 8 * half + l) * y->stride + 8 * g;
                    __m256 value = by_output[half][l];
                    if (y->accumulate) value = _mm256_add_ps(_mm256_loadu_ps(target), _mm256_mul_ps(value, _mm256_set1_ps(y->alpha)));
                    _mm256_storeu_ps(target, value);
                }
            }
        }
    }
done:
    free(quads);
    free(w_scale);
}

#else  /* never chosen (has_avx512_vnni is 0): the names only */
#define q6_k_rows_512 q6_k_rows
#define q0_eights_512 q0_eights
#endif

/* A repacked Q4_0 base weight (`block_q4_0x8`): per block the exact integer sum s, then
   `acc = fma(float(s), d_x * d_w, acc)`. */
static void q4_0_repacked(const int8_t *w, const float *w_scale, const int8_t *x, const float *x_scale, const paw_out *y,
                          int64_t blocks, int64_t rows, int64_t first, int64_t last) {
    for (int64_t o = first; o < last; ++o) {
        for (int64_t r = 0; r < rows; ++r) {
            float acc = 0.0f;
            for (int64_t b = 0; b < blocks; ++b) {
                int32_t s = sum_ints(q0_lanes(w + (o * blocks + b) * 32, x + (r * blocks + b) * 32));
                acc = fmaf((float)s, x_scale[r * blocks + b] * w_scale[o * blocks + b], acc);
            }
            put(y, r, o, acc);
        }
    }
}

/* ---- the tiled Q6_K kernel on AMX: the exact block sums from tile products, the float steps fused ---- */

/* 1 where AMX-INT8 runs here: the CPU has it (CPUID 7.0:EDX bits 24-25), the OS saves tile state (XCR0 bits 17-18)
   and grants this process its use (Linux's ARCH_REQ_XCOMP_PERM for XTILEDATA). */
int paw_amx_available(void) {
#ifdef PAW_BASELINE
    return 0;
#endif
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || ((d >> 24) & 3) != 3) return 0;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !((c >> 27) & 1)) return 0;  /* OSXSAVE: xgetbv may run */
    unsigned low, high;
    __asm__ volatile("xgetbv" : "=a"(low), "=d"(high) : "c"(0));
    if (((low >> 17) & 3) != 3) return 0;
#ifdef SYS_arch_prctl
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
#else
    return 0;
#endif
}

#ifndef PAW_BASELINE

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t columns[16];
    uint8_t rows[16];
} tile_config;

#define AMX_TARGET __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")))

/* 16 outputs' weights of one block, each code times its sub-block scale, w = (code - 32) * sub, split as
   64 * high + low into `high` and `low` [16][256] int8 (rows of AMX A tiles), from the packed codes. */
AMX_TARGET static void q6_k_weighted_rows(const uint8_t *w, const int8_t *sub, int64_t blocks, int64_t b,
                                          int8_t high[16][256], int8_t low[16][256]) {
    /* int16 element e of a half step (32 codes from 64c + 32h) lies in sub-block 4c + 2h + e / 16 */
    const __m512i spread = _mm512_set_epi16(1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                                            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i bias = _mm512_set1_epi8(32), mask = _mm512_set1_epi16(63);
    for (int n = 0; n < 16; ++n) {
        __m512i codes[4];
        q6_k_unpack_512(w + (n * blocks + b) * 192, codes);
        __m512i scales = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(sub + (n * blocks + b) * 16))));
        for (int step = 0; step < 4; ++step) {
            __m512i signed_codes = _mm512_sub_epi8(codes[step], bias);
            for (int half = 0; half < 2; ++half) {
                __m256i part = half ? _mm512_extracti64x4_epi64(signed_codes, 1) : _mm512_castsi512_si256(signed_codes);
                __m512i scale = _mm512_permutexvar_epi16(_mm512_add_epi16(spread, _mm512_set1_epi16((short)(4 * step + 2 * half))), scales);
                __m512i weighted = _mm512_mullo_epi16(_mm512_cvtepi8_epi16(part), scale);  /* |w| <= 4096 */
                _mm256_store_si256((__m256i *)(high[n] + 64 * step + 32 * half), _mm512_cvtepi16_epi8(_mm512_srai_epi16(weighted, 6)));
                _mm256_store_si256((__m256i *)(low[n] + 64 * step + 32 * half), _mm512_cvtepi16_epi8(_mm512_and_si512(weighted, mask)));
            }
        }
    }
}

/* A 16 x 16 float block transposed: `in` rows of `in_stride`, `out` rows of `out_stride`, `count` (<= 16) of the
   output rows written. */
AMX_TARGET static void transpose_16(const float *in, int64_t in_stride, float *out, int64_t out_stride, int count) {
    float block[16][16] __attribute__((aligned(64)));
    for (int i = 0; i < 16; ++i) {
        __m512i index = _mm512_add_epi32(_mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                                            _mm512_set1_epi32((int)in_stride)), _mm512_set1_epi32(i));
        _mm512_store_ps(block[i], _mm512_i32gather_ps(index, in, 4));
    }
    for (int i = 0; i < count; ++i) _mm512_storeu_ps(out + i * out_stride, _mm512_load_ps(block[i]));
}

/* q6_k_tiled's steps for outputs [16 first, 16 last) on AMX, the weights as A tiles (16 outputs x 64 codes, made
   from the packed codes per block, `q6_k_weighted_rows`) and the Q8_K codes as B tiles (`xv`: [blocks][4][tiles of
   16 rows][16][64], VNNI order): per block s = 64 * high + low (exact int32 from `tdpbssd`), then
   `acc = fma(float(s) * d_w, d_x, acc)` with the same roundings, on [output][row] vectors; `x_scale_t` is
   [blocks][padded rows]; y [rows, out] written. Returns -1 where scratch memory could not be had. */
AMX_TARGET static int q6_k_amx(const uint8_t *w, const int8_t *sub, const float *w_scale_t, const int8_t *xv,
                               const float *x_scale_t, float *y, int64_t rows, int64_t out, int64_t blocks,
                               int64_t first, int64_t last) {
    int64_t row_tiles = (rows + 15) / 16, padded = row_tiles * 16;
    float *acc = aligned_alloc(64, (size_t)(16 * padded) * sizeof(float));
    if (acc == NULL) return -1;
    tile_config config;
    memset(&config, 0, sizeof config);
    config.palette = 1;
    for (int t = 0; t < 8; ++t) {
        config.columns[t] = 64;
        config.rows[t] = 16;
    }
    _tile_loadconfig(&config);
    int8_t high[16][256] __attribute__((aligned(64))), low[16][256] __attribute__((aligned(64)));
    int32_t sums[4][16][16] __attribute__((aligned(64)));
    for (int64_t t = first; t < last; ++t) {
        memset(acc, 0, (size_t)(16 * padded) * sizeof(float));
        for (int64_t b = 0; b < blocks; ++b) {
            /* the next block's codes for these 16 outputs (16 rows apart): fetched while this one multiplies */
            const uint8_t *next = b + 1 < blocks ? w + (16 * t * blocks + b + 1) * 192
                                                 : (t + 1 < last ? w + 16 * (t + 1) * blocks * 192 : NULL);
            if (next != NULL)
                for (int n = 0; n < 16; ++n)
                    for (int line = 0; line < 192; line += 64) _mm_prefetch((const char *)(next + n * blocks * 192 + line), _MM_HINT_T0);
            q6_k_weighted_rows(w + 16 * t * blocks * 192, sub + 16 * t * blocks * 16, blocks, b, high, low);
            const float *dw = w_scale_t + b * out + 16 * t;
            for (int64_t m = 0; m < row_tiles; m += 2) {
                int pair = m + 1 < row_tiles;
                _tile_zero(4);
                _tile_zero(5);
                if (pair) {
                    _tile_zero(6);
                    _tile_zero(7);
                }
                for (int quarter = 0; quarter < 4; ++quarter) {
                    const int8_t *x_tiles = xv + ((b * 4 + quarter) * row_tiles + m) * 1024;
                    _tile_loadd(0, high[0] + 64 * quarter, 256);
                    _tile_loadd(1, low[0] + 64 * quarter, 256);
                    _tile_loadd(2, x_tiles, 64);
                    _tile_dpbssd(4, 0, 2);
                    _tile_dpbssd(5, 1, 2);
                    if (pair) {
                        _tile_loadd(3, x_tiles + 1024, 64);
                        _tile_dpbssd(6, 0, 3);
                        _tile_dpbssd(7, 1, 3);
                    }
                }
                _tile_stored(4, sums[0], 64);
                _tile_stored(5, sums[1], 64);
                if (pair) {
                    _tile_stored(6, sums[2], 64);
                    _tile_stored(7, sums[3], 64);
                }
                for (int part = 0; part <= pair; ++part) {
                    __m512 dx = _mm512_loadu_ps(x_scale_t + b * padded + 16 * (m + part));
                    for (int n = 0; n < 16; ++n) {
                        __m512i s = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(sums[2 * part][n]), 6),
                                                     _mm512_load_si512(sums[2 * part + 1][n]));
                        __m512 product = _mm512_mul_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(dw[n]));
                        float *a = acc + n * padded + 16 * (m + part);
                        _mm512_store_ps(a, _mm512_fmadd_ps(product, dx, _mm512_load_ps(a)));
                    }
                }
            }
        }
        for (int64_t m = 0; m < row_tiles; ++m) {
            int count = rows - 16 * m < 16 ? (int)(rows - 16 * m) : 16;
            transpose_16(acc + 16 * m, padded, y + 16 * m * out + 16 * t, out, count);
        }
    }
    _tile_release();
    free(acc);
    return 0;
}

#endif

/* ---- attention on an f16 KV cache (no flash attention), for SIMD widths W of 8 (AVX2) or 16 (AVX-512) ---- */

/* A W-lane register summed by halves: lanes [W/2, W) added to [0, W/2), until one is left. */
static inline float halves(float *lanes, int W) {
    for (int half = W / 2; half >= 1; half /= 2)
        for (int l = 0; l < half; ++l) lanes[l] = lanes[half + l] + lanes[l];
    return lanes[0];
}

/* ggml's one-row dots' 4 accumulators of W lanes (`lanes` [4W], overwritten) as one sum: added (0+2)+(1+3), then the
   lanes by halves (AVX-512) or GGML_F32x8_REDUCE (AVX2: halves to 4, then (a0+a1) + (a2+a3)). */
static inline float sum_accumulators(float *lanes, int W) {
    for (int l = 0; l < W; ++l) lanes[l] = (lanes[l] + lanes[2 * W + l]) + (lanes[W + l] + lanes[3 * W + l]);
    if (W == 16) return halves(lanes, 16);
    float quarter[4];
    for (int l = 0; l < 4; ++l) quarter[l] = lanes[l] + lanes[4 + l];
    return (quarter[0] + quarter[1]) + (quarter[2] + quarter[3]);
}

/* `ggml_v_expf`: AVX-512 form (W 16) scales 1 + p(b) by 2**n; AVX2 form (W 8) folds the 1 into the last FMA and
   scales the far ranges in two steps. */
static inline float expf_ggml(float x, int W) {
    const float shifter = 0x1.8p23f;
    float z = fmaf(x, 0x1.715476p+0f, shifter);
    float n = z - shifter;
    float b = fmaf(-n, 0x1.7f7d1cp-20f, fmaf(-n, 0x1.62e4p-1f, x));
    float u = b * b;
    float high = fmaf(fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u, fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f));
    if (n != n) return n;
    if (fabsf(n) > 192.0f) return n <= 0.0f ? 0.0f : INFINITY;
    if (W == 16) {
        float j = fmaf(high, u, fmaf(0x1.ffffecp-1f, b, 1.0f));
        return (float)ldexp((double)j, (int)n);
    }
    float j = fmaf(high, u, 0x1.ffffecp-1f * b);
    if (fabsf(n) <= 126.0f) {
        float power = ldexpf(1.0f, (int)n);
        return fmaf(j, power, power);
    }
    int shift = n <= 0.0f ? -125 : 127;
    float scaled = ldexpf(1.0f, (int)n - shift);
    return (float)((double)fmaf(scaled, j, scaled) * ldexp(1.0, shift));
}

/* expf_ggml on 8 values at once where every |n| <= 126 (2**n a normal float, so j * 2**n rounds once, as
   ldexp and scalef do); otherwise the 8 go one by one. */
static inline void expf_ggml8(const float *x, float *y, int W) {
    __m256 v = _mm256_loadu_ps(x);
    const __m256 shifter = _mm256_set1_ps(0x1.8p23f);
    __m256 z = _mm256_fmadd_ps(v, _mm256_set1_ps(0x1.715476p+0f), shifter);
    __m256 n = _mm256_sub_ps(z, shifter);
    __m256 minus_n = _mm256_sub_ps(_mm256_setzero_ps(), n);
    __m256 b = _mm256_fmadd_ps(minus_n, _mm256_set1_ps(0x1.7f7d1cp-20f),
                               _mm256_fmadd_ps(minus_n, _mm256_set1_ps(0x1.62e4p-1f), v));
    __m256 u = _mm256_mul_ps(b, b);
    __m256 high = _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b, _mm256_set1_ps(0x1.573e2ep-5f)), u,
                                  _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b, _mm256_set1_ps(0x1.fffdb6p-2f)));
    __m256 in_range = _mm256_cmp_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), n), _mm256_set1_ps(126.0f), _CMP_LE_OQ);
    if (_mm256_movemask_ps(in_range) != 0xFF) {
        for (int l = 0; l < 8; ++l) y[l] = expf_ggml(x[l], W);
        return;
    }
    __m256 power = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
    if (W == 16) {
        __m256 j = _mm256_fmadd_ps(high, u, _mm256_fmadd_ps(_mm256_set1_ps(0x1.ffffecp-1f), b, _mm256_set1_ps(1.0f)));
        _mm256_storeu_ps(y, _mm256_mul_ps(j, power));
    } else {
        __m256 j = _mm256_fmadd_ps(high, u, _mm256_mul_ps(_mm256_set1_ps(0x1.ffffecp-1f), b));
        _mm256_storeu_ps(y, _mm256_fmadd_ps(j, power, power));
    }
}

/* expf_ggml8 for W = 16 on sixteen values (AVX-512), each lane's operations the same; out of range, one by one. */
__attribute__((target("avx512f"))) static inline __m512 expf_ggml16(__m512 v) {
    const __m512 shifter = _mm512_set1_ps(0x1.8p23f);
    const __m512 z = _mm512_fmadd_ps(v, _mm512_set1_ps(0x1.715476p+0f), shifter);
    const __m512 n = _mm512_sub_ps(z, shifter), minus_n = _mm512_sub_ps(_mm512_setzero_ps(), n);
    const __m512 b = _mm512_fmadd_ps(minus_n, _mm512_set1_ps(0x1.7f7d1cp-20f), _mm512_fmadd_ps(minus_n, _mm512_set1_ps(0x1.62e4p-1f), v));
    const __m512 u = _mm512_mul_ps(b, b);
    const __m512 high = _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_set1_ps(0x1.0e4020p-7f), b, _mm512_set1_ps(0x1.573e2ep-5f)), u,
                                        _mm512_fmadd_ps(_mm512_set1_ps(0x1.555e66p-3f), b, _mm512_set1_ps(0x1.fffdb6p-2f)));
    if (_mm512_cmp_ps_mask(_mm512_abs_ps(n), _mm512_set1_ps(126.0f), _CMP_LE_OQ) != 0xFFFF) {
        float x[16], y[16];
        _mm512_storeu_ps(x, v);
        for (int l = 0; l < 16; ++l) y[l] = expf_ggml(x[l], 16);
        return _mm512_loadu_ps(y);
    }
    const __m512 power = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
    const __m512 j = _mm512_fmadd_ps(high, u, _mm512_fmadd_ps(_mm512_set1_ps(0x1.ffffecp-1f), b, _mm512_set1_ps(1.0f)));
    return _mm512_mul_ps(j, power);
}

void paw_expf(const float *x, float *y, int64_t count, int64_t width) {
    int64_t i = 0;
    for (; i + 8 <= count; i += 8) expf_ggml8(x + i, y + i, (int)width);
    for (; i < count; ++i) y[i] = expf_ggml(x[i], (int)width);
}

/* `ggml_v_silu` on sixteen values for W = 16 (AVX-512): x / (1 + expf(-x)), expf_ggml16 on the negated values (their
   sign bit flipped, as the 8-lane form does). */
__attribute__((target("avx512f"))) static inline __m512 silu_ggml16(__m512 x) {
    const __m512 minus = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(x), _mm512_set1_epi32((int)0x80000000u)));
    return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), expf_ggml16(minus)));
}

static inline float f16_value(uint16_t bits) { return _cvtsh_ss(bits); }

/* GGML_F32x8_REDUCE's last steps (AVX2 one-row dots): halves to 4 lanes, then (a0+a1)+(a2+a3). */
static inline float reduce_hadd(__m256 lanes) {
    __m128 four = _mm_add_ps(_mm256_castps256_ps128(lanes), _mm256_extractf128_ps(lanes, 1));
    __m128 pairs = _mm_hadd_ps(four, four);
    return _mm_cvtss_f32(_mm_hadd_ps(pairs, pairs));
}

/* q (float32 of f16 values) . k (f16). tinyBLAS (2 rows or more, `dim` a multiple of W): W lanes, lane l summing
   element l of every W in order, then the lanes by halves. `ggml_vec_dot_f16` (one row, or a `dim` tinyBLAS
   declines): 4 accumulators of W lanes over the whole steps of 4W, added (0+2)+(1+3), then the lanes by halves
   (AVX-512) or GGML_F32x8_REDUCE (AVX2); the last `dim % 4W` products added to that in double. f16 x f16 products
   are exact in float32, so each FMA rounds once, as the kernels' do. */
static inline float dot_f16(const float *q, const uint16_t *k, int64_t dim, int W, int one_row) {
    if (dim % W) one_row = 1;  /* tinyBLAS takes only whole vectors; ggml then dots row by row */
    int registers = (one_row ? 4 * W : W) / 8;  /* 8-lane registers a step: 1, 2, 4 or 8 */
    int64_t whole = dim - dim % (8 * registers);
    __m256 acc[8];
    for (int j = 0; j < registers; ++j) acc[j] = _mm256_setzero_ps();
    for (int64_t s = 0; s < whole; s += 8 * registers)
        for (int j = 0; j < registers; ++j)
            acc[j] = _mm256_fmadd_ps(_mm256_loadu_ps(q + s + 8 * j), load_f16(k + s + 8 * j), acc[j]);
    if (!one_row) return sum_halves(W == 16 ? _mm256_add_ps(acc[1], acc[0]) : acc[0]);
    int per = W / 8;  /* registers per accumulator */
    __m256 lanes[2];
    for (int j = 0; j < per; ++j)
        lanes[j] = _mm256_add_ps(_mm256_add_ps(acc[j], acc[2 * per + j]), _mm256_add_ps(acc[per + j], acc[3 * per + j]));
    double total = W == 16 ? sum_halves(_mm256_add_ps(lanes[1], lanes[0])) : reduce_hadd(lanes[0]);
    for (int64_t i = whole; i < dim; ++i) total += (double)(q[i] * f16_value(k[i]));
    return (float)total;
}

/* Four tinyBLAS dots at once, a . b[j] for j < 4 over k values (a multiple of W): each W lanes, lane l summing
   element l of every W in order, then the lanes by halves. Four at once keep 4-8 FMA chains in flight. */
static inline void dot4_tiled(const float *a, const float *const b[4], int64_t k, int W, float result[4]) {
    __m256 acc[4][2];
    for (int j = 0; j < 4; ++j) acc[j][0] = acc[j][1] = _mm256_setzero_ps();
    for (int64_t s = 0; s < k; s += W) {
        __m256 low = _mm256_loadu_ps(a + s);
        for (int j = 0; j < 4; ++j) acc[j][0] = _mm256_fmadd_ps(low, _mm256_loadu_ps(b[j] + s), acc[j][0]);
        if (W == 16) {
            __m256 high = _mm256_loadu_ps(a + s + 8);
            for (int j = 0; j < 4; ++j) acc[j][1] = _mm256_fmadd_ps(high, _mm256_loadu_ps(b[j] + s + 8), acc[j][1]);
        }
    }
    for (int j = 0; j < 4; ++j) result[j] = sum_halves(W == 16 ? _mm256_add_ps(acc[j][1], acc[j][0]) : acc[j][0]);
}

/* A 16-lane register summed by halves: lanes 8..15 onto 0..7, then as sum_halves. */
__attribute__((target("avx512f"))) static inline float sum_halves_512(__m512 lanes) {
    __m256 upper = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(lanes), 1));
    return sum_halves(_mm256_add_ps(upper, _mm512_castps512_ps256(lanes)));
}

/* dot4_tiled for W = 16 on AVX-512 (a CPU whose llama.cpp has 16 lanes has it): one register a dot, 8 at once. */
__attribute__((target("avx512f"))) static void dot8_tiled_512(const float *a, const float *const b[8], int64_t k,
                                                                float result[8]) {
    __m512 acc[8];
    for (int j = 0; j < 8; ++j) acc[j] = _mm512_setzero_ps();
    for (int64_t s = 0; s < k; s += 16) {
        __m512 av = _mm512_loadu_ps(a + s);
        for (int j = 0; j < 8; ++j) acc[j] = _mm512_fmadd_ps(av, _mm512_loadu_ps(b[j] + s), acc[j]);
    }
    for (int j = 0; j < 8; ++j) result[j] = sum_halves_512(acc[j]);
}

/* Sixteen registers each summed by halves (sum_halves_512's additions, in its order), out[i] from v[i]: the
   registers paired and folded together at each step, three instructions per pair, 45 in all. */
__attribute__((target("avx512f"))) static inline void sum_halves_16x512(const __m512 v[16], float out[16]) {
    __m512 eight[8], four[4], two[2];
    for (int i = 0; i < 8; ++i)  /* lanes l + (l + 8): chunks 0, 1 of v[2i] then of v[2i + 1] */
        eight[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE), _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44));
    for (int i = 0; i < 4; ++i)  /* l + (l + 4): chunk k holds register 4i + k's four */
        four[i] = _mm512_add_ps(_mm512_shuffle_f32x4(eight[2 * i], eight[2 * i + 1], 0x88),
                                _mm512_shuffle_f32x4(eight[2 * i], eight[2 * i + 1], 0xDD));
    for (int i = 0; i < 2; ++i)  /* (f0 + f2, f1 + f3) in chunk c: registers 8i + c (lanes 0, 1), 8i + 4 + c (2, 3) */
        two[i] = _mm512_add_ps(_mm512_shuffle_ps(four[2 * i], four[2 * i + 1], 0x44), _mm512_shuffle_ps(four[2 * i], four[2 * i + 1], 0xEE));
    /* lane 4c + k: register 4k + c's total */
    __m512 total = _mm512_add_ps(_mm512_shuffle_ps(two[0], two[1], 0x88), _mm512_shuffle_ps(two[0], two[1], 0xDD));
    _mm512_storeu_ps(out, _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), total));
}

/* Up to 8 tinyBLAS dots a . b[j] (`count` of them; the rest of b may repeat one), results in order. */
static inline void dots_tiled(const float *a, const float *const b[8], int count, int64_t k, int W, float result[8]) {
    if (W == 16) {
        dot8_tiled_512(a, b, k, result);
        return;
    }
    dot4_tiled(a, b, k, W, result);
    if (count > 4) dot4_tiled(a, b + 4, k, W, result + 4);
}

/* The softmax of one row of scores in place: ggml_v_expf of (score - top), a double sum of W-lane chunk sums,
   then each probability `p * (1/sum)` rounded to f16 (the value product reads them as f16). */
static inline void softmax_f16(float *row, int64_t padded, float top, int W) {
    double total = 0.0;
    __m256 top8 = _mm256_set1_ps(top);
    for (int64_t c = 0; c < padded; c += 8) _mm256_storeu_ps(row + c, _mm256_sub_ps(_mm256_loadu_ps(row + c), top8));
    for (int64_t c = 0; c < padded; c += 8) expf_ggml8(row + c, row + c, W);
    for (int64_t c = 0; c < padded; c += W) {  /* each chunk by halves */
        __m256 lanes = _mm256_loadu_ps(row + c);
        if (W == 16) lanes = _mm256_add_ps(_mm256_loadu_ps(row + c + 8), lanes);
        total += (double)sum_halves(lanes);
    }
    __m256 inverse = _mm256_set1_ps((float)(1.0 / total));
    for (int64_t p = 0; p < padded; p += 8)  /* padded is a multiple of 4W */
        _mm256_storeu_ps(row + p, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_mul_ps(_mm256_loadu_ps(row + p), inverse), 0)));
}

/* The highest of `count` scores, NaN skipped (as `s > top ? s : top` from -inf in order: a maximum, so any order). */
static inline float highest(const float *scores, int64_t count) {
    __m256 top8 = _mm256_set1_ps(-INFINITY);
    int64_t p = 0;
    for (; p + 8 <= count; p += 8) {
        __m256 s = _mm256_loadu_ps(scores + p);
        top8 = _mm256_blendv_ps(top8, s, _mm256_cmp_ps(s, top8, _CMP_GT_OQ));
    }
    float lanes[8], top = -INFINITY;
    _mm256_storeu_ps(lanes, top8);
    for (int l = 0; l < 8; ++l) top = lanes[l] > top ? lanes[l] : top;
    for (; p < count; ++p) top = scores[p] > top ? scores[p] : top;
    return top;
}

/* Values d..d+7 of eight positions' f16 rows, as float32 rows of eight positions: out[j * stride + k] =
   rows[k][d + j]. */
static inline void transpose_8(const uint16_t *const rows[8], int64_t d, float *out, int64_t stride) {
    __m256 r[8];
    for (int k = 0; k < 8; ++k) r[k] = load_f16(rows[k] + d);
    transpose_8x8(r);
    for (int k = 0; k < 8; ++k) _mm256_storeu_ps(out + k * stride, r[k]);
}

/* Two rows a0, a1 dotted with eight rows of b (`stride` floats apart) over k values (a multiple of 16), into
   dots[0..7] (a0's) and dots[8..15] (a1's): each dot tinyBLAS's (16 lanes in order, then by halves). Inlined into
   both its callers (one out-of-line call per eight keys cost prompt attention ~12%). */
__attribute__((target("avx512f"), always_inline)) static inline void pair_dots_512(const float *a0, const float *a1, const float *b,
                                                                                     int64_t stride, int64_t k, float dots[16]) {
    __m512 acc[16];
    for (int j = 0; j < 16; ++j) acc[j] = _mm512_setzero_ps();
    for (int64_t s = 0; s < k; s += 16) {
        const __m512 x0 = _mm512_loadu_ps(a0 + s), x1 = _mm512_loadu_ps(a1 + s);
        for (int j = 0; j < 8; ++j) {
            const __m512 y = _mm512_loadu_ps(b + j * stride + s);
            acc[j] = _mm512_fmadd_ps(x0, y, acc[j]);
            acc[8 + j] = _mm512_fmadd_ps(x1, y, acc[8 + j]);
        }
    }
    sum_halves_16x512(acc, dots);
}

/* Two rows' scores over keys [from, to) eight at a time (key_f [*, dim] float32, rows past `to` readable), times
   `scale`; all eight of a pass are stored (positions past a row's last are masked after). */
__attribute__((target("avx512f"))) static void scores_pair_512(const float *q0, const float *q1, const float *key_f, int64_t from,
                                                                 int64_t to, int64_t dim, float scale, float *s0, float *s1) {
    const __m256 factor = _mm256_set1_ps(scale);
    for (int64_t p = from; p < to; p += 8) {
        float dots[16];
        pair_dots_512(q0, q1, key_f + p * dim, dim, dim, dots);
        _mm256_storeu_ps(s0 + p, _mm256_mul_ps(_mm256_loadu_ps(dots), factor));
        _mm256_storeu_ps(s1 + p, _mm256_mul_ps(_mm256_loadu_ps(dots + 8), factor));
    }
}

/* pair_dots_512 with r0, r1 getting a0's and a1's eight dots (the value products: eight outputs of two rows). */
__attribute__((target("avx512f"))) static void rows_pair_512(const float *a0, const float *a1, const float *b, int64_t stride, int64_t k,
                                                               float *r0, float *r1) {
    float dots[16];
    pair_dots_512(a0, a1, b, stride, k, dots);
    memcpy(r0, dots, 8 * sizeof(float));
    memcpy(r1, dots + 8, 8 * sizeof(float));
}

#define ROW_BLOCK 32  /* query rows whose scores are kept at once */
#define KEY_CHUNK 64  /* keys (float32, 64 x D) multiplied by every row of a block while they are in L1 */

/* Attention for n > 1 rows (tinyBLAS products): each KV head's keys [length, D] and values transposed [D, padded]
   converted to float32 once; then, per block of query rows, the scores a chunk of keys at a time, the softmaxes,
   and the value products eight outputs at a time, so keys and values are read from L1 for every row of the
   block. On AVX-512 two rows a pass (each key or value chunk loaded once for both): row i + 1 sees one more
   position, whose score row i then masks and whose probability there is 0. Each dot is whole and in order. */
static void attention_rows(const float *q, const uint16_t *prefix_keys, const uint16_t *prefix_values,
                           int64_t prefix_length, int64_t prefix_stride, const uint16_t *keys, const uint16_t *values,
                           int64_t kv_stride, float *out, int64_t n, int64_t heads, int64_t group, int64_t dim,
                           int64_t length, int64_t padded, float scale, int W, int64_t first, int64_t last) {
    /* keys with 7 rows of zeros after them: a pass of eight keys may start at any visible position */
    float *key_f = malloc((size_t)((length + 7) * dim + dim * padded + ROW_BLOCK * padded + ROW_BLOCK * dim) * sizeof(float));
    if (key_f == NULL) return;
    float *value_t = key_f + (length + 7) * dim, *scores = value_t + dim * padded, *query = scores + ROW_BLOCK * padded;
    memset(key_f + length * dim, 0, (size_t)(7 * dim) * sizeof(float));
    int step = W == 16 ? 2 : 1;
    for (int64_t h = first; h < last; ++h) {
        int64_t kv = h / group;
        if (h == first || kv != (h - 1) / group) {
            const uint16_t *rows[8];
            for (int64_t p = 0; p < length; ++p) {
                const uint16_t *k = p < prefix_length ? prefix_keys + kv * prefix_stride + p * dim
                                                      : keys + kv * kv_stride + (p - prefix_length) * dim;
                rows[p % 8] = p < prefix_length ? prefix_values + kv * prefix_stride + p * dim
                                                : values + kv * kv_stride + (p - prefix_length) * dim;
                for (int64_t d = 0; d < dim; d += 8) _mm256_storeu_ps(key_f + p * dim + d, load_f16(k + d));
                if (p % 8 == 7)  /* eight positions' values, transposed 8 x 8 at a time */
                    for (int64_t d = 0; d < dim; d += 8) transpose_8(rows, d, value_t + d * padded + p - 7, padded);
            }
            for (int64_t p = length / 8 * 8; p < length; ++p)
                for (int64_t d = 0; d < dim; ++d) value_t[d * padded + p] = f16_value(rows[p % 8][d]);
            for (int64_t d = 0; d < dim; ++d)
                for (int64_t p = length; p < padded; ++p) value_t[d * padded + p] = 0.0f;
        }
        for (int64_t i0 = 0; i0 < n; i0 += ROW_BLOCK) {
            int64_t block = n - i0 < ROW_BLOCK ? n - i0 : ROW_BLOCK;
            for (int64_t r = 0; r < block; ++r)  /* dim is a multiple of 8 (64 or 128 here) */
                for (int64_t d = 0; d < dim; d += 8)
                    _mm256_storeu_ps(query + r * dim + d, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(q + ((i0 + r) * heads + h) * dim + d), 0)));
            int64_t first_visible = length - n + i0 + 1;  /* row i sees first_visible + (i - i0) positions */
            for (int64_t p0 = 0; p0 < first_visible + block - 1; p0 += KEY_CHUNK) {
                for (int64_t r = 0; r < block; r += step) {
                    int pair = r + 1 < block && step == 2;
                    int64_t seen = first_visible + r + pair, end = p0 + KEY_CHUNK < seen ? p0 + KEY_CHUNK : seen;
                    if (pair) {
                        scores_pair_512(query + r * dim, query + (r + 1) * dim, key_f, p0, end, dim, scale, scores + r * padded,
                                        scores + (r + 1) * padded);
                        continue;
                    }
                    for (int64_t p = p0; p < end; p += 8) {
                        const float *b[8];
                        for (int j = 0; j < 8; ++j) b[j] = key_f + (p + j < seen ? p + j : p) * dim;
                        float dots[8];
                        dots_tiled(query + r * dim, b, (int)(seen - p < 8 ? seen - p : 8), dim, W, dots);
                        for (int j = 0; j < 8 && p + j < seen; ++j) scores[r * padded + p + j] = dots[j] * scale;
                    }
                }
            }
            for (int64_t r = 0; r < block; ++r) {
                float *row = scores + r * padded;
                int64_t visible = first_visible + r;
                float top = highest(row, visible);
                for (int64_t p = visible; p < padded; ++p) row[p] = -INFINITY;
                softmax_f16(row, padded, top, W);
            }
            /* positions from `visible` on weigh 0: their products add nothing to any lane */
            for (int64_t d = 0; d < dim; d += 8) {  /* dim is a multiple of 8 (64 or 128 here) */
                const float *b[8];
                for (int j = 0; j < 8; ++j) b[j] = value_t + (d + j) * padded;
                for (int64_t r = 0; r < block; r += step) {
                    int pair = r + 1 < block && step == 2;
                    int64_t seen = first_visible + r + pair, span = (seen + W - 1) / W * W;
                    float *result = out + (i0 + r) * heads * dim + h * dim + d;
                    if (pair) rows_pair_512(scores + r * padded, scores + (r + 1) * padded, value_t + d * padded, padded, span, result, result + heads * dim);
                    else dots_tiled(scores + r * padded, b, 8, span, W, result);
                }
            }
        }
    }
    free(key_f);
}

/* The 8 positions' one-row dot lanes `v[k]` (each already folded to 8 lanes) reduced as ggml_vec_dot_f16 reduces one
   row's: transposed so lane k holds position k, then by halves (AVX-512's W = 16: (l0+l4)+(l2+l6) plus
   (l1+l5)+(l3+l7)) or GGML_F32x8_REDUCE (W = 8: ((l0+l4)+(l1+l5)) + ((l2+l6)+(l3+l7))). */
static inline __m256 reduce_8_rows(__m256 v[8], int W) {
    transpose_8x8(v);  /* v[c]: lane c of each position */
    __m256 lane[4];
    for (int c = 0; c < 4; ++c) lane[c] = _mm256_add_ps(v[c], v[c + 4]);  /* lane c + lane c + 4 of each position */
    if (W == 16) return _mm256_add_ps(_mm256_add_ps(lane[0], lane[2]), _mm256_add_ps(lane[1], lane[3]));
    return _mm256_add_ps(_mm256_add_ps(lane[0], lane[1]), _mm256_add_ps(lane[2], lane[3]));
}

#define VALUE_CHUNK 64  /* outputs of the value product whose accumulators are in registers at once */

/* Accumulator lane `lam` of the value product for outputs [d0, d0 + 8 chunks) (chunks <= VALUE_CHUNK / 8): one FMA
   chain of row[p] * v[p][d] over positions lam, lam + A, ... in order, stored at `target`. */
static inline __attribute__((always_inline)) void value_chain(const float *row, const float *prefix_value_f, const uint16_t *pv,
                                                              const uint16_t *ov, int64_t lam, int64_t A, int64_t prefix_length,
                                                              int64_t length, int64_t dim, int64_t d0, float *target, const int chunks) {
    __m256 acc[VALUE_CHUNK / 8];
    for (int c = 0; c < chunks; ++c) acc[c] = _mm256_setzero_ps();
    int64_t p = lam;  /* hidden positions weigh 0: nothing to add */
    if (prefix_value_f != NULL)  /* laid out by lane: position A k + lam at row lam * chain + k */
        for (; p < prefix_length; p += A) {
            const float *value = prefix_value_f + (lam * ((prefix_length + A - 1) / A) + p / A) * dim + d0;
            __m256 weight = _mm256_broadcast_ss(row + p);
            for (int c = 0; c < chunks; ++c) acc[c] = _mm256_fmadd_ps(weight, _mm256_loadu_ps(value + 8 * c), acc[c]);
        }
    for (; p < length; p += A) {
        const uint16_t *value = (p < prefix_length ? pv : ov) + p * dim + d0;
        __m256 weight = _mm256_broadcast_ss(row + p);
        for (int c = 0; c < chunks; ++c) acc[c] = _mm256_fmadd_ps(weight, load_f16(value + 8 * c), acc[c]);
    }
    for (int c = 0; c < chunks; ++c) _mm256_storeu_ps(target + 8 * c, acc[c]);
}

/* One decode row (n == 1) for heads [first, last), where `dim` is a whole number of ggml's 4W-value steps: each
   score is ggml_vec_dot_f16's (4 accumulators of W lanes, (0+2)+(1+3), its reduction), eight positions reduced at
   once; the value product is ggml_vec_dot_f16 of the probabilities with each output's values, computed for
   VALUE_CHUNK outputs at a time: accumulator lane `lam` (position p % 4W) is one FMA chain over its positions in
   order, and the 4W lanes are reduced as one row's. `prefix_key_f`/`prefix_value_f` (or NULL): the prefix's keys and
   values of the (single) KV head of heads [first, last) already in float32 (the same numbers as converting them
   here: f16 -> f32 is exact), read instead of the f16 ones: keys [P, D], values by accumulator lane (position
   4W k + lam at row lam * ceil(P / 4W) + k, so that a lane's chain reads consecutive rows). */
static inline __attribute__((always_inline)) void attention_one_row(
    const float *q, const uint16_t *prefix_keys, const uint16_t *prefix_values, int64_t prefix_length, int64_t prefix_stride,
    const float *prefix_key_f, const float *prefix_value_f, const uint16_t *keys, const uint16_t *values, int64_t kv_stride,
    float *out, int64_t group, int64_t dim, int64_t length, int64_t padded, float scale, const int W, int64_t first, int64_t last) {
    const int64_t A = 4 * W;  /* accumulator lanes of a one-row dot */
    float *scratch = malloc((size_t)(padded + dim + 4 * dim + W * dim) * sizeof(float));
    if (scratch == NULL) return;
    float *row = scratch, *query = row + padded, *lanes = query + dim, *folded = lanes + 4 * dim;  /* [4][dim], [W][dim] */
    const int registers = (int)(A / 8), per = W / 8;
    for (int64_t h = first; h < last; ++h) {
        const int64_t kv = h / group;
        const uint16_t *pk = prefix_keys + kv * prefix_stride, *ok = keys + kv * kv_stride - prefix_length * dim;
        const uint16_t *pv = prefix_values + kv * prefix_stride, *ov = values + kv * kv_stride - prefix_length * dim;
        for (int64_t d = 0; d < dim; ++d) query[d] = f16_round(q[h * dim + d]);
        for (int64_t p0 = 0; p0 < padded; p0 += 8) {
            __m256 v[8];
            for (int k = 0; k < 8; ++k) {
                int64_t p = p0 + k < length ? p0 + k : length - 1;  /* past the cache: any row, masked below */
                const uint16_t *key = (p < prefix_length ? pk : ok) + p * dim;
                const float *key_f = p < prefix_length && prefix_key_f != NULL ? prefix_key_f + p * dim : NULL;
                __m256 acc[8];
                for (int j = 0; j < registers; ++j) acc[j] = _mm256_setzero_ps();
                if (key_f != NULL)
                    for (int64_t s = 0; s < dim; s += A)
                        for (int j = 0; j < registers; ++j)
                            acc[j] = _mm256_fmadd_ps(_mm256_loadu_ps(query + s + 8 * j), _mm256_loadu_ps(key_f + s + 8 * j), acc[j]);
                else
                    for (int64_t s = 0; s < dim; s += A)
                        for (int j = 0; j < registers; ++j)
                            acc[j] = _mm256_fmadd_ps(_mm256_loadu_ps(query + s + 8 * j), load_f16(key + s + 8 * j), acc[j]);
                __m256 lanes[2];
                for (int j = 0; j < per; ++j)
                    lanes[j] = _mm256_add_ps(_mm256_add_ps(acc[j], acc[2 * per + j]), _mm256_add_ps(acc[per + j], acc[3 * per + j]));
                v[k] = W == 16 ? _mm256_add_ps(lanes[1], lanes[0]) : lanes[0];
            }
            __m256 s = _mm256_mul_ps(reduce_8_rows(v, W), _mm256_set1_ps(scale));
            __m256 seen = _mm256_cmp_ps(_mm256_add_ps(_mm256_set1_ps((float)p0), _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7)),
                                        _mm256_set1_ps((float)length), _CMP_LT_OQ);
            s = _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), s, seen);
            _mm256_storeu_ps(row + p0, s);
        }
        softmax_f16(row, padded, highest(row, length), W);
        /* lane `lam` of output d: the chain over positions lam, lam + 4W, ... of row[p] * v[p][d], VALUE_CHUNK outputs
           at a time; each position's row is read once, in order of position */
        for (int l = 0; l < W; ++l) {
            for (int j = 0; j < 4; ++j) {
                const int64_t lam = j * W + l;
                for (int64_t d0 = 0; d0 < dim; d0 += VALUE_CHUNK) {
                    float *target = lanes + j * dim + d0;
                    if (dim - d0 >= VALUE_CHUNK)
                        value_chain(row, prefix_value_f, pv, ov, lam, A, prefix_length, length, dim, d0, target, VALUE_CHUNK / 8);
                    else  /* the last outputs of a head size that is no multiple of VALUE_CHUNK (AVX2's 4W is 32) */
                        value_chain(row, prefix_value_f, pv, ov, lam, A, prefix_length, length, dim, d0, target, (int)((dim - d0) / 8));
                }
            }
            for (int64_t d = 0; d < dim; d += 8) {  /* (0 + 2) + (1 + 3) */
                __m256 a0 = _mm256_loadu_ps(lanes + d), a1 = _mm256_loadu_ps(lanes + dim + d);
                __m256 a2 = _mm256_loadu_ps(lanes + 2 * dim + d), a3 = _mm256_loadu_ps(lanes + 3 * dim + d);
                _mm256_storeu_ps(folded + l * dim + d, _mm256_add_ps(_mm256_add_ps(a0, a2), _mm256_add_ps(a1, a3)));
            }
        }
        float *result = out + h * dim;
        for (int64_t d = 0; d < dim; d += 8) {
            __m256 f[16];
            for (int l = 0; l < W; ++l) f[l] = _mm256_loadu_ps(folded + l * dim + d);
            __m256 total;
            if (W == 16) {  /* by halves */
                for (int half = 8; half >= 1; half /= 2)
                    for (int l = 0; l < half; ++l) f[l] = _mm256_add_ps(f[half + l], f[l]);
                total = f[0];
            } else {  /* GGML_F32x8_REDUCE */
                for (int l = 0; l < 4; ++l) f[l] = _mm256_add_ps(f[l], f[4 + l]);
                total = _mm256_add_ps(_mm256_add_ps(f[0], f[1]), _mm256_add_ps(f[2], f[3]));
            }
            _mm256_storeu_ps(result + d, total);
        }
    }
    free(scratch);
}

static void one_row(const float *q, const uint16_t *prefix_keys, const uint16_t *prefix_values, int64_t prefix_length,
                    int64_t prefix_stride, const float *prefix_key_f, const float *prefix_value_f, const uint16_t *keys,
                    const uint16_t *values, int64_t kv_stride, float *out, int64_t group, int64_t dim, int64_t length, int64_t padded,
                    float scale, int W, int64_t first, int64_t last);

/* llama.cpp's attention for query heads [first, last): q [n, H, D] float32 (the last n of the cached positions,
   causal) over a program's prefix (f16 [KV, *, D], `prefix_stride` values between heads) then the sequence's own
   positions (`kv_stride`), as one cache; out [n, H * D]. Scores: f16(q) . k (tinyBLAS for n > 1, one-row for
   n == 1), times `scale`, masked; softmax with ggml_v_expf and a double sum of W-lane chunk sums; probabilities
   rounded to f16; then probabilities . v over the positions padded to `padded` (hidden positions weigh 0, and
   their products add nothing), computed for all D outputs at once: lane l of output d accumulates the positions
   that lane takes in the dot's order. */
void paw_attention(const float *q, const uint16_t *prefix_keys, const uint16_t *prefix_values, int64_t prefix_length,
                   int64_t prefix_stride, const uint16_t *keys, const uint16_t *values, int64_t own_length,
                   int64_t kv_stride, float *out, int64_t n, int64_t heads, int64_t kv_heads, int64_t dim,
                   int64_t padded, float scale, int64_t width, int64_t first, int64_t last) {
    int64_t length = prefix_length + own_length;
    if (n > 1) {
        attention_rows(q, prefix_keys, prefix_values, prefix_length, prefix_stride, keys, values, kv_stride, out, n,
                       heads, heads / kv_heads, dim, length, padded, scale, (int)width, first, last);
        return;
    }
    int W = (int)width;
    if (n == 1 && dim % (4 * W) == 0) {
        one_row(q, prefix_keys, prefix_values, prefix_length, prefix_stride, NULL, NULL, keys, values, kv_stride, out, heads / kv_heads,
                dim, length, padded, scale, W, first, last);
        return;
    }
    /* one row (n == 1) whose head size is not a whole number of 4W-value steps */
    float *scratch = malloc((size_t)(padded + dim + 64 * dim) * sizeof(float));
    if (scratch == NULL) return;
    int64_t group = heads / kv_heads;
    int accumulators = 4 * W;
    float *row = scratch;             /* [padded] scores, then probabilities */
    float *query = row + padded;      /* [D] */
    float *acc = query + dim;         /* [accumulators, D]: the value product's lanes for every output */
    for (int64_t h = first; h < last; ++h) {
        int64_t kv = h / group;
        for (int64_t i = 0; i < n; ++i) {
            for (int64_t d = 0; d < dim; ++d) query[d] = f16_round(q[(i * heads + h) * dim + d]);
            int64_t visible = length - n + i + 1;
            float top = -INFINITY;
            for (int64_t p = 0; p < padded; ++p) {
                float s = -INFINITY;
                if (p < visible) {
                    const uint16_t *k = p < prefix_length ? prefix_keys + kv * prefix_stride + p * dim
                                                          : keys + kv * kv_stride + (p - prefix_length) * dim;
                    s = dot_f16(query, k, dim, W, 1) * scale;
                }
                row[p] = s;
                top = s > top ? s : top;
            }
            softmax_f16(row, padded, top, W);
            memset(acc, 0, (size_t)(accumulators * dim) * sizeof(float));
            for (int64_t p = 0; p < visible; ++p) {
                const uint16_t *v = p < prefix_length ? prefix_values + kv * prefix_stride + p * dim
                                                      : values + kv * kv_stride + (p - prefix_length) * dim;
                float *lane = acc + (p % accumulators) * dim;
                __m256 weight = _mm256_set1_ps(row[p]);
                for (int64_t d = 0; d < dim; d += 8)
                    _mm256_storeu_ps(lane + d, _mm256_fmadd_ps(weight, load_f16(v + d), _mm256_loadu_ps(lane + d)));
            }
            float *result = out + i * heads * dim + h * dim;
            for (int64_t d = 0; d < dim; ++d) {
                float lanes[64];
                for (int l = 0; l < accumulators; ++l) lanes[l] = acc[l * dim + d];
                result[d] = sum_accumulators(lanes, W);
            }
        }
    }
    free(scratch);
}

/* attention_one_row for W = 16 on AVX-512 (llama.cpp's 16 lanes mean the CPU has it), `D` (64, 128 or 256) a
   compile-time constant so that the query and the value accumulators stay in registers: a score's four 16-lane
   accumulators are one register each (ggml's sum[0..3]), folded (0 + 2) + (1 + 3), then the two halves, then
   reduced eight positions at once as the 8-lane code does; a value lane's chain is D / 16 registers over its
   positions in order. The same FMAs and additions in the same order as attention_one_row, so the same bits. */
__attribute__((target("avx512f"), always_inline)) static inline void attention_one_row_512(
    const float *q, const uint16_t *prefix_keys, const uint16_t *prefix_values, int64_t prefix_length, int64_t prefix_stride,
    const float *prefix_key_f, const float *prefix_value_f, const uint16_t *keys, const uint16_t *values, int64_t kv_stride,
    float *out, int64_t group, const int D, int64_t length, int64_t padded, float scale, int64_t first, int64_t last) {
    float *scratch = malloc((size_t)(padded + 4 * D + 16 * D) * sizeof(float));
    if (scratch == NULL) return;
    float *row = scratch, *lanes = row + padded, *folded = lanes + 4 * D;  /* [4][D], [16][D] */
    for (int64_t h = first; h < last; ++h) {
        const int64_t kv = h / group;
        const uint16_t *pk = prefix_keys + kv * prefix_stride, *ok = keys + kv * kv_stride - prefix_length * D;
        const uint16_t *pv = prefix_values + kv * prefix_stride, *ov = values + kv * kv_stride - prefix_length * D;
        __m512 query[D / 16];
        for (int c = 0; c < D / 16; ++c)
            query[c] = _mm512_cvtph_ps(_mm512_cvtps_ph(_mm512_loadu_ps(q + h * D + 16 * c), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        for (int64_t p0 = 0; p0 < padded; p0 += 8) {
            __m256 v[8];
            for (int k = 0; k < 8; ++k) {
                int64_t p = p0 + k < length ? p0 + k : length - 1;  /* past the cache: any row, masked below */
                __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
                if (p < prefix_length && prefix_key_f != NULL) {
                    const float *key = prefix_key_f + p * D;
                    for (int c = 0; c < D / 16; ++c) acc[c % 4] = _mm512_fmadd_ps(query[c], _mm512_loadu_ps(key + 16 * c), acc[c % 4]);
                } else {
                    const uint16_t *key = (p < prefix_length ? pk : ok) + p * D;
                    for (int c = 0; c < D / 16; ++c)
                        acc[c % 4] = _mm512_fmadd_ps(query[c], _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(key + 16 * c))), acc[c % 4]);
                }
                __m512 t = _mm512_add_ps(_mm512_add_ps(acc[0], acc[2]), _mm512_add_ps(acc[1], acc[3]));
                v[k] = _mm256_add_ps(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(t), 1)), _mm512_castps512_ps256(t));
            }
            __m256 sc = _mm256_mul_ps(reduce_8_rows(v, 16), _mm256_set1_ps(scale));
            __m256 seen = _mm256_cmp_ps(_mm256_add_ps(_mm256_set1_ps((float)p0), _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7)),
                                        _mm256_set1_ps((float)length), _CMP_LT_OQ);
            _mm256_storeu_ps(row + p0, _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), sc, seen));
        }
        softmax_f16(row, padded, highest(row, length), 16);
        for (int l = 0; l < 16; ++l) {
            for (int j = 0; j < 4; ++j) {
                __m512 acc[D / 16];
                for (int c = 0; c < D / 16; ++c) acc[c] = _mm512_setzero_ps();
                int64_t p = 16 * j + l;  /* hidden positions weigh 0: nothing to add */
                if (prefix_value_f != NULL) {  /* laid out by lane: position 64k + lam at row lam * chain + k */
                    const float *value = prefix_value_f + p * ((prefix_length + 63) / 64) * D;  /* lam = p here */
                    for (; p < prefix_length; p += 64, value += D) {
                        const __m512 weight = _mm512_set1_ps(row[p]);
                        for (int c = 0; c < D / 16; ++c) acc[c] = _mm512_fmadd_ps(weight, _mm512_loadu_ps(value + 16 * c), acc[c]);
                    }
                }
                for (; p < length; p += 64) {
                    const uint16_t *value = (p < prefix_length ? pv : ov) + p * D;
                    const __m512 weight = _mm512_set1_ps(row[p]);
                    for (int c = 0; c < D / 16; ++c)
                        acc[c] = _mm512_fmadd_ps(weight, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(value + 16 * c))), acc[c]);
                }
                for (int c = 0; c < D / 16; ++c) _mm512_storeu_ps(lanes + j * D + 16 * c, acc[c]);
            }
            for (int c = 0; c < D / 16; ++c) {  /* (0 + 2) + (1 + 3) */
                __m512 a0 = _mm512_loadu_ps(lanes + 16 * c), a1 = _mm512_loadu_ps(lanes + D + 16 * c);
                __m512 a2 = _mm512_loadu_ps(lanes + 2 * D + 16 * c), a3 = _mm512_loadu_ps(lanes + 3 * D + 16 * c);
                _mm512_storeu_ps(folded + l * D + 16 * c, _mm512_add_ps(_mm512_add_ps(a0, a2), _mm512_add_ps(a1, a3)));
            }
        }
        for (int c = 0; c < D / 16; ++c) {  /* the 16 lanes by halves */
            __m512 f[16];
            for (int l = 0; l < 16; ++l) f[l] = _mm512_loadu_ps(folded + l * D + 16 * c);
            for (int half = 8; half >= 1; half /= 2)
                for (int l = 0; l < half; ++l) f[l] = _mm512_add_ps(f[half + l], f[l]);
            _mm512_storeu_ps(out + h * D + 16 * c, f[0]);
        }
    }
    free(scratch);
}

/* attention_one_row_512 for head size `dim` (64, 128 or 256), each its own copy. */
__attribute__((target("avx512f"))) static void attention_one_row_16(
    const float *q, const uint16_t *prefix_keys, const uint16_t *prefix_values, int64_t prefix_length, int64_t prefix_stride,
    const float *prefix_key_f, const float *prefix_value_f, const uint16_t *keys, const uint16_t *values, int64_t kv_stride,
    float *out, int64_t group, int64_t dim, int64_t length, int64_t padded, float scale, int64_t first, int64_t last) {
    if (dim == 64)
        attention_one_row_512(q, prefix_keys, prefix_values, prefix_length, prefix_stride, prefix_key_f, prefix_value_f, keys, values,
                              kv_stride, out, group, 64, length, padded, scale, first, last);
    else if (dim == 128)
        attention_one_row_512(q, prefix_keys, prefix_values, prefix_length, prefix_stride, prefix_key_f, prefix_value_f, keys, values,
                              kv_stride, out, group, 128, length, padded, scale, first, last);
    else
        attention_one_row_512(q, prefix_keys, prefix_values, prefix_length, prefix_stride, prefix_key_f, prefix_value_f, keys, values,
                              kv_stride, out, group, 256, length, padded, scale, first, last);
}

/* One decode row (`attention_one_row`'s arguments) on the copy made for its width and head size: AVX-512 registers
   for W = 16 and D 64, 128 or 256, else the 8-lane code with its loops unrolled for W. */
static void one_row(const float *q, const uint16_t *prefix_keys, const uint16_t *prefix_values, int64_t prefix_length,
                    int64_t prefix_stride, const float *prefix_key_f, const float *prefix_value_f, const uint16_t *keys,
                    const uint16_t *values, int64_t kv_stride, float *out, int64_t group, int64_t dim, int64_t length, int64_t padded,
                    float scale, int W, int64_t first, int64_t last) {
    if (W == 16 && (dim == 64 || dim == 128 || dim == 256))
        attention_one_row_16(q, prefix_keys, prefix_values, prefix_length, prefix_stride, prefix_key_f, prefix_value_f, keys, values,
                             kv_stride, out, group, dim, length, padded, scale, first, last);
    else if (W == 16)
        attention_one_row(q, prefix_keys, prefix_values, prefix_length, prefix_stride, prefix_key_f, prefix_value_f, keys, values,
                          kv_stride, out, group, dim, length, padded, scale, 16, first, last);
    else
        attention_one_row(q, prefix_keys, prefix_values, prefix_length, prefix_stride, prefix_key_f, prefix_value_f, keys, values,
                          kv_stride, out, group, dim, length, padded, scale, 8, first, last);
}

/* One decode step's rows each attended alone (`attention_one_row`, every row's numbers those of the row by itself),
   for KV heads [first, last): q [n, H, D] float32, out [n, H * D]; rows[i] = {prefix keys, prefix values, prefix
   length, prefix head stride, keys, values, own length, head stride} (pointers as integers; a row without a prefix
   has length 0). Rows that share a prefix (a program's, adjacent in a step) share its float32 conversion: each KV
   head's prefix keys and values are converted once for all of them, the conversions being about half of a one-row
   kernel's instructions. `dim` is a whole number of 4W-value steps. Each row's new key and value (k_new, v_new
   [n, KV, D] float32, rows k_stride and v_stride apart) are first stored as f16 at its last own position, as
   llama.cpp copies them into its cache before attending. */
static void attention_step(const float *q, const float *k_new, int64_t k_stride, const float *v_new, int64_t v_stride, const int64_t *rows, float *out,
                           int64_t n, int64_t heads, int64_t kv_heads, int64_t dim, float scale, int W, int64_t first, int64_t last) {
    const int64_t group = heads / kv_heads;
    int64_t longest = 0;
    for (int64_t i = 0; i < n; ++i) longest = rows[8 * i + 2] > longest ? rows[8 * i + 2] : longest;
    /* keys [longest, D], then values by lane: up to 4W - 1 rows past `longest` (a lane's chain is rounded up) */
    float *converted = longest ? malloc((size_t)((2 * longest + 4 * W) * dim) * sizeof(float)) : NULL;
    if (longest && converted == NULL) return;
    for (int64_t kv = first; kv < last; ++kv) {
        const uint16_t *held = NULL;  /* the prefix keys whose head kv is in `converted` */
        for (int64_t i = 0; i < n; ++i) {
            const int64_t *row = rows + 8 * i;
            const uint16_t *prefix_keys = (const uint16_t *)(intptr_t)row[0], *prefix_values = (const uint16_t *)(intptr_t)row[1];
            const int64_t prefix_length = row[2], prefix_stride = row[3], length = prefix_length + row[6];
            const int64_t padded = (length + 4 * W - 1) / (4 * W) * (4 * W);
            if (prefix_length && held != prefix_keys) {
                const uint16_t *pk = prefix_keys + kv * prefix_stride, *pv = prefix_values + kv * prefix_stride;
                const int64_t A = 4 * W, chain = (prefix_length + A - 1) / A;
                for (int64_t p = 0; p < prefix_length; ++p)
                    for (int64_t d = 0; d < dim; d += 8) {
                        _mm256_storeu_ps(converted + p * dim + d, load_f16(pk + p * dim + d));
                        _mm256_storeu_ps(converted + (longest + (p % A) * chain + p / A) * dim + d, load_f16(pv + p * dim + d));
                    }
                held = prefix_keys;
            }
            const float *key_f = prefix_length ? converted : NULL, *value_f = prefix_length ? converted + longest * dim : NULL;
            uint16_t *keys = (uint16_t *)(intptr_t)row[4], *values = (uint16_t *)(intptr_t)row[5];  /* this step writes them */
            uint16_t *last_key = keys + kv * row[7] + (row[6] - 1) * dim, *last_value = values + kv * row[7] + (row[6] - 1) * dim;
            for (int64_t d = 0; d < dim; d += 8) {  /* dim is a multiple of 8 */
                _mm_storeu_si128((__m128i *)(last_key + d), _mm256_cvtps_ph(_mm256_loadu_ps(k_new + i * k_stride + kv * dim + d), 0));
                _mm_storeu_si128((__m128i *)(last_value + d), _mm256_cvtps_ph(_mm256_loadu_ps(v_new + i * v_stride + kv * dim + d), 0));
            }
            one_row(q + i * heads * dim, prefix_keys, prefix_values, prefix_length, prefix_stride, key_f, value_f, keys, values, row[7],
                    out + i * heads * dim, group, dim, length, padded, scale, W, kv * group, (kv + 1) * group);
        }
    }
    free(converted);
}

/* ---- Qwen3.5's own ops (hybrid.py documents each rule): the fused delta rule and flash attention ---- */

/* The C library's float32 functions per value, as ggml's scalar ops call them: 0 expf, 1 logf, 2 `ggml_sigmoid`
   (1 / (1 + expf(-x))), 3 `ggml_softplus` (logf(1 + expf(x)), x itself above 20). */
void paw_libm(int64_t op, const float *x, float *y, int64_t count) {
    for (int64_t i = 0; i < count; ++i) {
        const float v = x[i];
        switch (op) {
        case 0: y[i] = expf(v); break;
        case 1: y[i] = logf(v); break;
        case 2: y[i] = 1.0f / (1.0f + expf(-v)); break;
        default: y[i] = v > 20.0f ? v : logf(1.0f + expf(v)); break;
        }
    }
}

/* `ggml_ssm_conv`: out [T, channels] from the window by time, [K - 1 + T, channels], and the taps by tap, [K, channels].
   Each output sums its K products in order from 0: the first `rounded` products rounded and added (GCC's AVX2 build
   vectorizes `sumf += s * c` by 4 and 8 taps that way), the rest by FMA (its AVX-512 build and every loop tail). The
   channels are the inner loop, each output's own sum of products, so they take vector lanes (channel by channel
   through the steps the window was read across rows: 14 ms a Qwen3.5 layer for 582 rows). Steps [first, last). */
static void silu_rows(const float *x, int64_t stride, int64_t per, float *y, int64_t n, int width, int64_t first, int64_t last);

/* One step of ssm_conv_steps sixteen channels a register (AVX-512, channels a multiple of 16): each output's K products
   summed in the same order in a register, and (`silu`, width 16) `ggml_v_silu` of it before the one store (the row's
   K passes through memory and a SiLU pass of its own took 3.5 ms of a 582-row Qwen3.5 layer). */
__attribute__((target("avx512f"))) static void ssm_conv_step_512(const float *const tap_rows[], const float *taps, float *total, int64_t channels,
                                                               int64_t K, int64_t rounded, int silu) {
    for (int64_t c = 0; c < channels; c += 16) {
        __m512 sum = _mm512_setzero_ps();
        for (int64_t i = 0; i < K; ++i) {
            const __m512 w = _mm512_loadu_ps(tap_rows[i] + c), k = _mm512_loadu_ps(taps + i * channels + c);
            sum = i < rounded ? _mm512_add_ps(sum, _mm512_mul_ps(w, k)) : _mm512_fmadd_ps(w, k, sum);
        }
        _mm512_storeu_ps(total + c, silu ? silu_ggml16(sum) : sum);
    }
}

/* `ggml_ssm_conv` for steps [first, last) of the window by time: its first K - 1 rows `window` [K - 1, channels], then
   the step rows, row s at rows + s * stride (read where the projection left them). Each output row the K taps'
   products, the first `rounded` rounded and added, the rest by FMA; then (`silu`) `ggml_silu` of the row, as silu_rows
   computes it, while it is in L1 (Qwen3.5 convolves then activates: one pass over the outputs instead of two). */
static void ssm_conv_steps(const float *window, const float *rows, int64_t stride, const float *taps, float *out, int64_t channels,
                           int64_t K, int64_t rounded, int silu, int width, int64_t first, int64_t last) {
    if (avx512_on() && channels % 16 == 0 && K <= 16) {
        for (int64_t t = first; t < last; ++t) {
            const float *tap_rows[16];
            for (int64_t i = 0; i < K; ++i) tap_rows[i] = t + i < K - 1 ? window + (t + i) * channels : rows + (t + i - (K - 1)) * stride;
            ssm_conv_step_512(tap_rows, taps, out + t * channels, channels, K, rounded, silu && width == 16);
            if (silu && width != 16) silu_rows(out + t * channels, channels, 1, out + t * channels, channels, width, 0, 1);
        }
        return;
    }
    for (int64_t t = first; t < last; ++t) {
        float *total = out + t * channels;
        for (int64_t c = 0; c < channels; ++c) total[c] = 0.0f;
        for (int64_t i = 0; i < K; ++i) {
            const int64_t at = t + i;  /* the row in the window by time */
            const float *w = at < K - 1 ? window + at * channels : rows + (at - (K - 1)) * stride, *k = taps + i * channels;
            if (i < rounded)
                for (int64_t c = 0; c < channels; ++c) {
                    const float product = w[c] * k[c];
                    total[c] = total[c] + product;
                }
            else
                for (int64_t c = 0; c < channels; ++c) total[c] = fmaf(w[c], k[c], total[c]);
        }
        if (silu) silu_rows(total, channels, 1, total, channels, width, 0, 1);
    }
}

/* `ggml_vec_dot_f32`: 4 accumulators of W lanes, FMA chains over each step of 4W values, added (0+2)+(1+3), then
   the lanes (by halves with AVX-512, GGML_F32x8_REDUCE with AVX2); the last n % 4W products rounded, added in order. */
static inline float dot_f32_ggml(const float *x, const float *y, int64_t n, int W) {
    int64_t step = 4 * W, whole = n - n % step;
    float total = 0.0f;
    if (whole) {
        float acc[64] = {0};
        for (int64_t s = 0; s < whole; s += step)
            for (int64_t l = 0; l < step; ++l) acc[l] = fmaf(x[s + l], y[s + l], acc[l]);
        total = sum_accumulators(acc, W);
    }
    for (int64_t i = whole; i < n; ++i) total = total + x[i] * y[i];
    return total;
}

/* ggml_vec_dot_f32's four accumulators of 16 lanes folded to one register: added (0+2)+(1+3). */
__attribute__((target("avx512f"))) static inline __m512 ggml_f32_fold_512(const __m512 acc[4]) {
    return _mm512_add_ps(_mm512_add_ps(acc[0], acc[2]), _mm512_add_ps(acc[1], acc[3]));
}

/* ggml_vec_dot_f32's four accumulators of 16 lanes to one float: folded, then the lanes by halves. */
__attribute__((target("avx512f"))) static inline float ggml_f32_total_512(const __m512 acc[4]) {
    return sum_halves_512(ggml_f32_fold_512(acc));
}

/* `dot_f32_ggml` for W = 16 on AVX-512: its four accumulators as registers, added (0+2)+(1+3), then by halves. */
__attribute__((target("avx512f"))) static float dot_f32_ggml_512(const float *x, const float *y, int64_t n) {
    const int64_t whole = n - n % 64;
    float total = 0.0f;
    if (whole) {
        __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
        for (int64_t s = 0; s < whole; s += 64)
            for (int j = 0; j < 4; ++j) acc[j] = _mm512_fmadd_ps(_mm512_loadu_ps(x + s + 16 * j), _mm512_loadu_ps(y + s + 16 * j), acc[j]);
        total = ggml_f32_total_512(acc);
    }
    for (int64_t i = whole; i < n; ++i) total = total + x[i] * y[i];
    return total;
}

/* One token of gated_delta_net on sixteen rows of one head's state on AVX-512, for heads of 128 (Qwen3.5's; W = 16),
   in two halves: a row's decay, its dot with k, its update and its dot with q touch that row alone, so gated_delta_net
   takes blocks of rows (8 KB each) through all the tokens while they stay in L1, k and q in registers (token by token
   over the whole 64 KB matrix, four passes each, it took 37 ms a 582-row layer). Every value's operations as
   gated_delta_net's, each dot's order as dot_f32_ggml_512's (from +0, so a -0 product stays +0).
   The first half: the rows decayed and dotted with k, each dot's accumulators folded (0+2)+(1+3), their lanes summed
   together; `deltas` becomes (v - dot) * b for the block's sixteen values of v. */
AVX512_TARGET static inline __attribute__((always_inline)) void delta_rule_deltas(const float *m, const __m512 keys[8], const float *v, float decay,
                                                                                 float b, float deltas[16]) {
    const __m512 decay16 = _mm512_set1_ps(decay), zero = _mm512_setzero_ps();
    __m512 folded[16];
    for (int r = 0; r < 16; ++r) {
        const float *row = m + r * 128;
        __m512 x[8], acc[4];
        for (int c = 0; c < 8; ++c) x[c] = _mm512_mul_ps(_mm512_loadu_ps(row + 16 * c), decay16);
        for (int c = 0; c < 4; ++c) acc[c] = _mm512_fmadd_ps(x[c + 4], keys[c + 4], _mm512_fmadd_ps(x[c], keys[c], zero));
        folded[r] = ggml_f32_fold_512(acc);
    }
    sum_halves_16x512(folded, deltas);
    _mm512_storeu_ps(deltas, _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(v), _mm512_loadu_ps(deltas)), _mm512_set1_ps(b)));
}

/* The second half: each row decayed again (the same product: no store between) and updated by k times its delta, then
   dotted with q; `out` the block's sixteen outputs. */
AVX512_TARGET static inline __attribute__((always_inline)) void delta_rule_update(float *m, const __m512 keys[8], const __m512 queries[8], float decay,
                                                                                 const float deltas[16], float scale, float *out) {
    const __m512 decay16 = _mm512_set1_ps(decay), zero = _mm512_setzero_ps();
    __m512 folded[16];
    for (int r = 0; r < 16; ++r) {
        float *row = m + r * 128;
        const __m512 delta = _mm512_set1_ps(deltas[r]);
        __m512 x[8], acc[4];
        for (int c = 0; c < 8; ++c) {
            x[c] = _mm512_fmadd_ps(keys[c], delta, _mm512_mul_ps(_mm512_loadu_ps(row + 16 * c), decay16));
            _mm512_storeu_ps(row + 16 * c, x[c]);
        }
        for (int c = 0; c < 4; ++c) acc[c] = _mm512_fmadd_ps(x[c + 4], queries[c + 4], _mm512_fmadd_ps(x[c], queries[c], zero));
        folded[r] = ggml_f32_fold_512(acc);
    }
    float dots[16];
    sum_halves_16x512(folded, dots);
    _mm512_storeu_ps(out, _mm512_mul_ps(_mm512_loadu_ps(dots), _mm512_set1_ps(scale)));
}

/* One token on 32 rows (two blocks of sixteen): both blocks' deltas, then both updates, so one block's sums across
   registers (a chain of dependent steps) overlap the other block's products; ad hoc, 8 heads of one 582-row layer on
   one thread, 9.7-10.2 -> 8.4-8.7 ms against one block at a time. v and out: the 32 rows' values. */
AVX512_TARGET static void delta_rule_32_rows_512(float *m, const float *q, const float *k, const float *v, float decay, float b, float scale,
                                                 float *out) {
    __m512 keys[8], queries[8];
    for (int c = 0; c < 8; ++c) {
        keys[c] = _mm512_loadu_ps(k + 16 * c);
        queries[c] = _mm512_loadu_ps(q + 16 * c);
    }
    float first[16], second[16];
    delta_rule_deltas(m, keys, v, decay, b, first);
    delta_rule_deltas(m + 16 * 128, keys, v + 16, decay, b, second);
    delta_rule_update(m, keys, queries, decay, first, scale, out);
    delta_rule_update(m + 16 * 128, keys, queries, decay, second, scale, out + 16);
}

/* llama.cpp's fused GATED_DELTA_NET for heads [first, last) of one sequence: q, k [T, H, S] (normed, one per value
   head), v's token t at v + t * v_stride (its H * S values contiguous: the convolution's columns read in place), g and
   beta [T, H]; `state` [H, S (value j), S (key i)] (ggml's transposed layout), updated in place; `out` [T, H, S]. */
static void gated_delta_net(const float *q, const float *k, const float *v, int64_t v_stride, const float *g, const float *beta,
                            float *state, float *out, int64_t T, int64_t H, int64_t S, int W, int64_t first, int64_t last) {
    const float scale = 1.0f / sqrtf((float)S);
    const int wide = W == 16 && avx512_on();
    float *delta = malloc(sizeof(float) * (S + T)), *decays = delta + S;
    if (!delta) return;
    for (int64_t h = first; h < last; ++h) {
        float *m = state + h * S * S;
        if (wide && S == 128) {  /* 32 rows at a time through every token; the decays (expf) once */
            for (int64_t t = 0; t < T; ++t) decays[t] = expf(g[t * H + h]);
            for (int64_t j0 = 0; j0 < S; j0 += 32)
                for (int64_t t = 0; t < T; ++t) {
                    const int64_t at = (t * H + h) * S;
                    delta_rule_32_rows_512(m + j0 * S, q + at, k + at, v + t * v_stride + h * S + j0, decays[t], beta[t * H + h], scale,
                                           out + at + j0);
                }
            continue;
        }
        for (int64_t t = 0; t < T; ++t) {
            const int64_t at = (t * H + h) * S;
            const float decay = expf(g[t * H + h]), b = beta[t * H + h];
            for (int64_t e = 0; e < S * S; ++e) m[e] = m[e] * decay;
            for (int64_t j = 0; j < S; ++j)
                delta[j] = (v[t * v_stride + h * S + j] - (wide ? dot_f32_ggml_512(m + j * S, k + at, S) : dot_f32_ggml(m + j * S, k + at, S, W))) * b;
            for (int64_t j = 0; j < S; ++j)
                for (int64_t i = 0; i < S; ++i) m[j * S + i] = fmaf(k[at + i], delta[j], m[j * S + i]);
            for (int64_t j = 0; j < S; ++j)
                out[at + j] = (wide ? dot_f32_ggml_512(m + j * S, q + at, S) : dot_f32_ggml(m + j * S, q + at, S, W)) * scale;
        }
    }
    free(delta);
}

/* The f16 accumulator of ggml's one-chunk flash attention, kept as float32 values each rounded to f16:
   `ggml_vec_scale_f16` (sums * shrink) and `ggml_vec_mad_f16` (sums + v * weight, fused), eight lanes at a time with
   F16C's rounding, the very instruction f16_round uses (a value at a time they were 85% of a 41-row batch's 28 ms). */
static inline __m256 f16_round8(__m256 x) { return _mm256_cvtph_ps(_mm256_cvtps_ph(x, 0)); }

static inline void f16_scale(float *sums, float shrink, int64_t D) {
    const __m256 factor = _mm256_set1_ps(shrink);
    int64_t d = 0;
    for (; d + 8 <= D; d += 8) _mm256_storeu_ps(sums + d, f16_round8(_mm256_mul_ps(_mm256_loadu_ps(sums + d), factor)));
    for (; d < D; ++d) sums[d] = f16_round(sums[d] * shrink);
}

static inline void f16_mad(float *sums, const uint16_t *v, float weight, int64_t D) {
    const __m256 factor = _mm256_set1_ps(weight);
    int64_t d = 0;
    for (; d + 8 <= D; d += 8) _mm256_storeu_ps(sums + d, f16_round8(_mm256_fmadd_ps(load_f16(v + d), factor, _mm256_loadu_ps(sums + d))));
    for (; d < D; ++d) sums[d] = f16_round(fmaf(f16_value(v[d]), weight, sums[d]));
}

/* f16_scale and f16_mad sixteen lanes at a time (AVX-512's conversions round as F16C's), for D a multiple of 16. */
__attribute__((target("avx512f"))) static void f16_scale_16(float *sums, float shrink, int64_t D) {
    const __m512 factor = _mm512_set1_ps(shrink);
    for (int64_t d = 0; d < D; d += 16)
        _mm512_storeu_ps(sums + d, _mm512_cvtph_ps(_mm512_cvtps_ph(_mm512_mul_ps(_mm512_loadu_ps(sums + d), factor), 0)));
}

__attribute__((target("avx512f"))) static void f16_mad_16(float *sums, const uint16_t *v, float weight, int64_t D) {
    const __m512 factor = _mm512_set1_ps(weight);
    for (int64_t d = 0; d < D; d += 16) {
        const __m512 value = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(v + d)));
        _mm512_storeu_ps(sums + d, _mm512_cvtph_ps(_mm512_cvtps_ph(_mm512_fmadd_ps(value, factor, _mm512_loadu_ps(sums + d)), 0)));
    }
}

/* `ggml_compute_forward_flash_attn_ext_f16_one_chunk` over cells [cell_first, cell_last) for (row, head) pairs
   [first, last) of q [n, H, D] (row r at cache position positions0 + r, causal): Q rounded to f16, each cell's
   score by `ggml_vec_dot_f16`, online softmax with V summed in f16. Writes the unnormalized sums [n, H, D] (f16
   values as float32), the maximum and the softmax sum [n, H]. k/v: [KV, cells, D] f16, head stride k_stride. */
static void flash_online(const float *q, const uint16_t *k, const uint16_t *v, int64_t kv_stride, int64_t n, int64_t H, int64_t KV,
                         int64_t D, int64_t positions0, int64_t cell_first, int64_t cell_last, float scale, int W, float *acc,
                         float *high, float *total, int64_t first, int64_t last) {
    float *query = malloc(sizeof(float) * D);
    if (!query) return;
    const int wide = avx512_on() && D % 16 == 0;
    for (int64_t p = first; p < last; ++p) {
        const int64_t r = p / H, h = p % H, kvh = h / (H / KV), position = positions0 + r;
        const uint16_t *keys = k + kvh * kv_stride, *values = v + kvh * kv_stride;
        float *sums = acc + p * D, m = -INFINITY, s = 0.0f;
        for (int64_t d = 0; d < D; ++d) {
            query[d] = f16_round(q[p * D + d]);
            sums[d] = 0.0f;
        }
        const int64_t end = cell_last < position + 1 ? cell_last : position + 1;
        for (int64_t c = cell_first; c < end; ++c) {
            const float score = dot_f16(query, keys + c * D, D, W, 1) * scale;
            float shrink = 1.0f, weight = 1.0f;
            if (score > m) {
                shrink = expf(m - score);
                m = score;
                (wide ? f16_scale_16 : f16_scale)(sums, shrink, D);
            } else {
                weight = expf(score - m);
            }
            (wide ? f16_mad_16 : f16_mad)(sums, values + c * D, weight, D);
            s = fmaf(s, shrink, weight);
        }
        high[p] = m;
        total[p] = s;
    }
    free(query);
}

#define PAW_FA_TILE 64

/* Four rows' scores against a tile: scores[i][c] = sum over d of query[i][d] * tile_keys[d][c], an FMA chain over d
   from 0 (the scalar loop's order), sixteen cells a register, the tile's keys loaded once for the four rows. */
__attribute__((target("avx512f"))) static void tile_scores_4(const float *const query[4], const float *tile_keys, int64_t D,
                                                           float scores[4][PAW_FA_TILE]) {
    __m512 acc[4][PAW_FA_TILE / 16];
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < PAW_FA_TILE / 16; ++j) acc[i][j] = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; ++d) {
        __m512 key[PAW_FA_TILE / 16];
        for (int j = 0; j < PAW_FA_TILE / 16; ++j) key[j] = _mm512_loadu_ps(tile_keys + d * PAW_FA_TILE + 16 * j);
        for (int i = 0; i < 4; ++i) {
            const __m512 qd = _mm512_set1_ps(query[i][d]);
            for (int j = 0; j < PAW_FA_TILE / 16; ++j) acc[i][j] = _mm512_fmadd_ps(qd, key[j], acc[i][j]);
        }
    }
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < PAW_FA_TILE / 16; ++j) _mm512_storeu_ps(scores[i] + 16 * j, acc[i][j]);
}

/* `tile_values_4` for `chunks` registers (a constant where inlined: the accumulators stay in registers). */
static inline __attribute__((always_inline, target("avx512f"))) void tile_values_chunks(const float *weights, int64_t row_step, int64_t cell_step,
                                                                                      const float *tile_values, int64_t D, int64_t d0,
                                                                                      float *const result[4], const int chunks) {
    __m512 acc[4][4];
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < chunks; ++j) acc[i][j] = _mm512_loadu_ps(result[i] + d0 + 16 * j);
    for (int c = 0; c < PAW_FA_TILE; ++c) {
        __m512 value[4];
        for (int j = 0; j < chunks; ++j) value[j] = _mm512_loadu_ps(tile_values + c * D + d0 + 16 * j);
        for (int i = 0; i < 4; ++i) {
            const __m512 weight = _mm512_set1_ps(weights[i * row_step + c * cell_step]);
            for (int j = 0; j < chunks; ++j) acc[i][j] = _mm512_fmadd_ps(weight, value[j], acc[i][j]);
        }
    }
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < chunks; ++j) _mm512_storeu_ps(result[i] + d0 + 16 * j, acc[i][j]);
}

/* Four rows' results += their weights times the tile's values: result[i][d] FMA chains over the cells in order (the
   scalar loop's), D a multiple of 16, sixty-four of a row's values in registers at a time. Row i's weight for cell c
   is weights[i * row_step + c * cell_step] (rows of a tile, or a tile's cells by rows). */
__attribute__((target("avx512f"))) static void tile_values_4(const float *weights, int64_t row_step, int64_t cell_step, const float *tile_values,
                                                           int64_t D, float *const result[4]) {
    int64_t d0 = 0;
    for (; d0 + 64 <= D; d0 += 64) tile_values_chunks(weights, row_step, cell_step, tile_values, D, d0, result, 4);
    switch ((D - d0) / 16) {
    case 3: tile_values_chunks(weights, row_step, cell_step, tile_values, D, d0, result, 3); break;
    case 2: tile_values_chunks(weights, row_step, cell_step, tile_values, D, d0, result, 2); break;
    case 1: tile_values_chunks(weights, row_step, cell_step, tile_values, D, d0, result, 1); break;
    default: break;
    }
}

/* tile_softmax for W = 16 (AVX-512) on a tile every cell of which the row sees: sixteen lanes a step, each value's
   operations and the sums' order the same (a register's lanes by halves, the four in order, in double). */
__attribute__((target("avx512f"))) static void tile_softmax_16(float *scores, float scale, int64_t D, float *result, float *high,
                                                             float *total) {
    __m512 values[PAW_FA_TILE / 16], tops = _mm512_set1_ps(-INFINITY);
    for (int g = 0; g < PAW_FA_TILE / 16; ++g) {
        values[g] = _mm512_mul_ps(_mm512_loadu_ps(scores + 16 * g), _mm512_set1_ps(scale));
        tops = _mm512_max_ps(tops, values[g]);
    }
    const float top = _mm512_reduce_max_ps(tops), newer = fmaxf(*high, top);  /* a maximum in any order */
    if (newer > *high) {
        const float shrink = expf(*high - newer);
        int64_t d = 0;
        for (; d + 16 <= D; d += 16) _mm512_storeu_ps(result + d, _mm512_mul_ps(_mm512_loadu_ps(result + d), _mm512_set1_ps(shrink)));
        for (; d < D; ++d) result[d] = result[d] * shrink;
        *total = *total * shrink;
    }
    *high = newer;
    double running = 0.0;
    for (int g = 0; g < PAW_FA_TILE / 16; ++g) {
        const __m512 weights = expf_ggml16(_mm512_sub_ps(values[g], _mm512_set1_ps(newer)));
        _mm512_storeu_ps(scores + 16 * g, weights);
        running += (double)sum_halves_512(weights);
    }
    *total = (float)((double)*total + running);
}

/* One row's online softmax step over a tile of raw scores (`scores` becomes its weights): masked cells (past the
   cache, or past `position` when causal) at -inf, the running maximum and sum updated and its `result` rescaled
   where the maximum rises, weights by `ggml_v_expf` summed by W-lane halves in double. */
static void tile_softmax(float *scores, int64_t start, int64_t length, int64_t position, float scale, int W, int64_t D,
                         float *result, float *high, float *total) {
    if (W == 16 && avx512_on() && start + PAW_FA_TILE <= length && start + PAW_FA_TILE - 1 <= position) {
        tile_softmax_16(scores, scale, D, result, high, total);
        return;
    }
    float top = -INFINITY;
    if (start + PAW_FA_TILE <= length && start + PAW_FA_TILE - 1 <= position) {  /* every cell seen: eight at a time */
        const __m256 scale8 = _mm256_set1_ps(scale);
        __m256 tops = _mm256_set1_ps(-INFINITY);
        for (int c = 0; c < PAW_FA_TILE; c += 8) {
            const __m256 scaled = _mm256_mul_ps(_mm256_loadu_ps(scores + c), scale8);
            _mm256_storeu_ps(scores + c, scaled);
            tops = _mm256_max_ps(tops, scaled);
        }
        float lanes[8];
        _mm256_storeu_ps(lanes, tops);
        for (int l = 0; l < 8; ++l) top = lanes[l] > top ? lanes[l] : top;
    } else {
        for (int c = 0; c < PAW_FA_TILE; ++c) {
            const int64_t cell = start + c;
            scores[c] = cell < length && cell <= position ? scores[c] * scale : -INFINITY;
            if (scores[c] > top) top = scores[c];
        }
    }
    const float newer = fmaxf(*high, top);
    if (newer > *high) {
        const float shrink = expf(*high - newer);
        for (int64_t d = 0; d < D; ++d) result[d] = result[d] * shrink;
        *total = *total * shrink;
    }
    *high = newer;
    double running = 0.0;
    const __m256 newer8 = _mm256_set1_ps(newer);
    for (int c = 0; c < PAW_FA_TILE; c += 8) {
        _mm256_storeu_ps(scores + c, _mm256_sub_ps(_mm256_loadu_ps(scores + c), newer8));
        expf_ggml8(scores + c, scores + c, W);
    }
    for (int c0 = 0; c0 < PAW_FA_TILE; c0 += W) {  /* each W lanes by halves */
        const __m256 low = _mm256_loadu_ps(scores + c0);
        running += (double)sum_halves(W == 16 ? _mm256_add_ps(_mm256_loadu_ps(scores + c0 + 8), low) : low);
    }
    *total = (float)((double)*total + running);
}

/* Head h's n rows of out [n, H, D] divided by their softmax sums (times 1/total; rows with no weight stay 0). */
static void normalize_head(float *out, const float *totals, int64_t n, int64_t H, int64_t h, int64_t D) {
    for (int64_t r = 0; r < n; ++r) {
        const float inverse = totals[r] == 0.0f ? 0.0f : 1.0f / totals[r];
        for (int64_t d = 0; d < D; ++d) out[(r * H + h) * D + d] = out[(r * H + h) * D + d] * inverse;
    }
}

/* ---- flash_tiled for rows that see every cell (an image's patches), sixteen rows a register (AVX-512) ----
   The same operations on each value in the same order as tile_scores_4, tile_softmax_16 and tile_values_4; rows in
   the lanes make the softmax's maximum and its sums by halves plain additions across registers, in place of a
   reduction within each row's register (they were a fifth of a 1936-patch image's attention). */

/* Scores of `G` groups of sixteen rows against four cells [c0, c0 + 4): scores[c][16g + l] = sum over d of
   query[g][d][l] * tile_keys[c][d], an FMA chain over d from 0 (tile_scores_4's). */
static inline __attribute__((always_inline, target("avx512f"))) void scores_by_cells(const float *query, const float *tile_keys, int64_t D,
                                                                                   int c0, float *scores, const int G) {
    __m512 acc[4][4];
    for (int i = 0; i < 4; ++i)
        for (int g = 0; g < G; ++g) acc[i][g] = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; ++d) {
        __m512 rows[4];
        for (int g = 0; g < G; ++g) rows[g] = _mm512_loadu_ps(query + (g * D + d) * 16);
        for (int i = 0; i < 4; ++i) {
            const __m512 key = _mm512_set1_ps(tile_keys[(c0 + i) * D + d]);
            for (int g = 0; g < G; ++g) acc[i][g] = _mm512_fmadd_ps(rows[g], key, acc[i][g]);
        }
    }
    for (int i = 0; i < 4; ++i)
        for (int g = 0; g < G; ++g) _mm512_storeu_ps(scores + (c0 + i) * PAW_FA_TILE + 16 * g, acc[i][g]);
}

/* A tile's scores for `groups` (1-4) groups of sixteen rows: query [groups][D][16], tile_keys [64][D], scores [64][64]. */
__attribute__((target("avx512f"))) static void tile_scores_by_cells(const float *query, const float *tile_keys, int64_t D, int groups,
                                                                  float *scores) {
    for (int c0 = 0; c0 < PAW_FA_TILE; c0 += 4) switch (groups) {
        case 4: scores_by_cells(query, tile_keys, D, c0, scores, 4); break;
        case 3: scores_by_cells(query, tile_keys, D, c0, scores, 3); break;
        case 2: scores_by_cells(query, tile_keys, D, c0, scores, 2); break;
        default: scores_by_cells(query, tile_keys, D, c0, scores, 1); break;
        }
}

/* tile_softmax_16 for sixteen rows at once: scores[c * 64 + l] is row l's score for cell c (`valid` cells, weights 0
   past them, as the -inf of the masked cells give); they become the weights. Row l's maximum high[l] and sum total[l]
   updated; returns the rows whose maximum rose, `shrinks` their results' factors (expf(old - new)). */
__attribute__((target("avx512f"))) static __mmask16 tile_softmax_by_cells(float *scores, int64_t valid, float scale, float *high, float *total,
                                                                        float shrinks[16]) {
    const __m512 factor = _mm512_set1_ps(scale);
    __m512 tops = _mm512_set1_ps(-INFINITY);
    for (int64_t c = 0; c < valid; ++c) tops = _mm512_max_ps(tops, _mm512_mul_ps(_mm512_loadu_ps(scores + c * PAW_FA_TILE), factor));
    const __m512 old = _mm512_loadu_ps(high), newer = _mm512_max_ps(old, tops);
    const __mmask16 rose = _mm512_cmp_ps_mask(newer, old, _CMP_GT_OQ);
    __m512 sum = _mm512_loadu_ps(total);
    if (rose) {
        float before[16], after[16];
        _mm512_storeu_ps(before, old);
        _mm512_storeu_ps(after, newer);
        for (int l = 0; l < 16; ++l) shrinks[l] = rose >> l & 1 ? expf(before[l] - after[l]) : 1.0f;
        sum = _mm512_mask_mul_ps(sum, rose, sum, _mm512_loadu_ps(shrinks));
    }
    _mm512_storeu_ps(high, newer);
    __m512d running[2] = {_mm512_setzero_pd(), _mm512_setzero_pd()};
    for (int64_t c0 = 0; c0 < PAW_FA_TILE; c0 += 16) {  /* sum_halves_512 over cells c0..c0+15, across registers */
        __m512 eight[8];
        for (int half = 1; half >= 0; --half)
            for (int l = 0; l < 8; ++l) {
                const int64_t c = c0 + 8 * half + l;
                const __m512 weight = c < valid ? expf_ggml16(_mm512_sub_ps(_mm512_mul_ps(_mm512_loadu_ps(scores + c * PAW_FA_TILE), factor), newer))
                                                : _mm512_setzero_ps();
                _mm512_storeu_ps(scores + c * PAW_FA_TILE, weight);
                eight[l] = half ? weight : _mm512_add_ps(eight[l], weight);
            }
        const __m512 four[4] = {_mm512_add_ps(eight[0], eight[4]), _mm512_add_ps(eight[1], eight[5]), _mm512_add_ps(eight[2], eight[6]),
                                _mm512_add_ps(eight[3], eight[7])};
        const __m512 lanes = _mm512_add_ps(_mm512_add_ps(four[0], four[2]), _mm512_add_ps(four[1], four[3]));
        running[0] = _mm512_add_pd(running[0], _mm512_cvtps_pd(_mm512_castps512_ps256(lanes)));
        running[1] = _mm512_add_pd(running[1], _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(lanes), 1))));
    }
    const __m256 low = _mm512_cvtpd_ps(_mm512_add_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(sum)), running[0]));
    const __m256 upper = _mm512_cvtpd_ps(
        _mm512_add_pd(_mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(sum), 1))), running[1]));
    _mm512_storeu_ps(total, _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(low)), _mm256_castps_pd(upper), 1)));
    return rose;
}

/* flash_tiled's heads [first, last) where each of the n rows (a multiple of 16) sees all `length` cells: for each
   tile of 64 cells, blocks of up to 64 rows take their scores by cells (queries transposed once per head), the
   softmax sixteen rows a register, then tile_values_4 four rows at a time. Returns 0 where memory ran out. */
__attribute__((target("avx512f"))) static int flash_tiled_seen(const float *q, const uint16_t *k, const uint16_t *v, int64_t kv_stride, int64_t n,
                                                             int64_t H, int64_t KV, int64_t D, int64_t length, float scale, float *out,
                                                             int64_t first, int64_t last) {
    float *query = malloc(sizeof(float) * n * D), *tile_keys = malloc(sizeof(float) * D * PAW_FA_TILE);
    float *tile_values = malloc(sizeof(float) * D * PAW_FA_TILE), *scores = malloc(sizeof(float) * PAW_FA_TILE * PAW_FA_TILE);
    float *highs = malloc(sizeof(float) * n), *totals = malloc(sizeof(float) * n);
    const int ok = query && tile_keys && tile_values && scores && highs && totals;
    for (int64_t h = first; ok && h < last; ++h) {
        const uint16_t *keys = k + h / (H / KV) * kv_stride, *values = v + h / (H / KV) * kv_stride;
        for (int64_t r = 0; r < n; ++r) {  /* query[group][d][lane], row 16 * group + lane */
            for (int64_t d = 0; d < D; ++d) query[(r / 16 * D + d) * 16 + r % 16] = q[(r * H + h) * D + d];
            for (int64_t d = 0; d < D; ++d) out[(r * H + h) * D + d] = 0.0f;
            highs[r] = -INFINITY;
            totals[r] = 0.0f;
        }
        for (int64_t start = 0; start < length; start += PAW_FA_TILE) {
            const int64_t valid = length - start < PAW_FA_TILE ? length - start : PAW_FA_TILE;
            for (int64_t c = 0; c < PAW_FA_TILE; ++c)  /* both widened as rows; zeros past the cache */
                for (int64_t d = 0; d < D; d += 16) {
                    const __m256i *key = (const __m256i *)(keys + (start + c) * D + d), *value = (const __m256i *)(values + (start + c) * D + d);
                    _mm512_storeu_ps(tile_keys + c * D + d, _mm512_cvtph_ps(c < valid ? _mm256_loadu_si256(key) : _mm256_setzero_si256()));
                    _mm512_storeu_ps(tile_values + c * D + d, _mm512_cvtph_ps(c < valid ? _mm256_loadu_si256(value) : _mm256_setzero_si256()));
                }
            for (int64_t r0 = 0; r0 < n; r0 += PAW_FA_TILE) {
                const int groups = n - r0 < PAW_FA_TILE ? (int)((n - r0) / 16) : 4;
                tile_scores_by_cells(query + r0 * D, tile_keys, D, groups, scores);
                for (int g = 0; g < groups; ++g) {
                    const int64_t row = r0 + 16 * g;
                    float shrinks[16];
                    const __mmask16 rose = tile_softmax_by_cells(scores + 16 * g, valid, scale, highs + row, totals + row, shrinks);
                    for (int l = 0; l < 16; ++l)
                        if (rose >> l & 1) {
                            float *result = out + ((row + l) * H + h) * D;
                            const __m512 shrink = _mm512_set1_ps(shrinks[l]);
                            for (int64_t d = 0; d < D; d += 16) _mm512_storeu_ps(result + d, _mm512_mul_ps(_mm512_loadu_ps(result + d), shrink));
                        }
                }
                for (int64_t i0 = 0; i0 < 16 * groups; i0 += 4) {
                    float *result[4];
                    for (int i = 0; i < 4; ++i) result[i] = out + ((r0 + i0 + i) * H + h) * D;
                    tile_values_4(scores + i0, 1, PAW_FA_TILE, tile_values, D, result);
                }
            }
        }
        normalize_head(out, totals, n, H, h, D);
    }
    free(query);
    free(tile_keys);
    free(tile_values);
    free(scores);
    free(highs);
    free(totals);
    return ok;
}

/* `ggml_compute_forward_flash_attn_ext_tiled` for heads [first, last) of q [n, H, D] (row r at cache position
   positions0 + r, causal; a position past the cache sees it all) over the cache's first `length` cells: scores as
   FMA chains over Q (float32) and K widened from f16, tiles of 64 cells with `ggml_v_expf` softmax summed in
   double, V summed by FMA chains. Writes the normalized outputs [n, H, D]. Rows take the tiles up to their own
   position (later ones are all masked); with AVX-512 (W 16) four rows at a time, in the same order. */
static void flash_tiled(const float *q, const uint16_t *k, const uint16_t *v, int64_t kv_stride, int64_t n, int64_t H, int64_t KV,
                        int64_t D, int64_t positions0, int64_t length, float scale, int W, float *out, int64_t first, int64_t last) {
    if (W == 16 && avx512_on() && D % 16 == 0 && positions0 >= length - 1 && n >= 16) {  /* every row sees every cell */
        const int64_t whole = n - n % 16;
        if (flash_tiled_seen(q, k, v, kv_stride, whole, H, KV, D, length, scale, out, first, last)) {
            if (whole == n) return;
            q += whole * H * D;  /* the last rows as below */
            out += whole * H * D;
            n -= whole;
            positions0 += whole;
        }
    }
    float *tile_keys = malloc(sizeof(float) * D * PAW_FA_TILE), *tile_values = malloc(sizeof(float) * D * PAW_FA_TILE);
    float *highs = malloc(sizeof(float) * n), *totals = malloc(sizeof(float) * n);
    float scores[4][PAW_FA_TILE];
    const int grouped = W == 16 && avx512_on() && D % 16 == 0;
    float *row_scores = grouped ? malloc(sizeof(float) * PAW_FA_TILE * (n + 4)) : NULL;
    if (!tile_keys || !tile_values || !highs || !totals || (grouped && !row_scores)) goto done;
    for (int64_t h = first; h < last; ++h) {
        const int64_t kvh = h / (H / KV);
        const uint16_t *keys = k + kvh * kv_stride, *values = v + kvh * kv_stride;
        for (int64_t r = 0; r < n; ++r) {
            highs[r] = -INFINITY;
            totals[r] = 0.0f;
            for (int64_t d = 0; d < D; ++d) out[(r * H + h) * D + d] = 0.0f;
        }
        for (int64_t start = 0; start < length && start <= positions0 + n - 1; start += PAW_FA_TILE) {
            for (int c = 0; c < PAW_FA_TILE; ++c)  /* K transposed, V as rows, both widened; zeros past the cache */
                for (int64_t d = 0; d < D; ++d) {
                    const int inside = start + c < length;
                    tile_keys[d * PAW_FA_TILE + c] = inside ? f16_value(keys[(start + c) * D + d]) : 0.0f;
                    tile_values[c * D + d] = inside ? f16_value(values[(start + c) * D + d]) : 0.0f;
                }
            /* four rows at a time that all see this tile (a row sees none of a tile past its position: no change),
               in three passes over them so that each pass keeps one tile in L1: scores, softmax, values */
            int64_t together = 0;
            if (grouped)
                for (; together + 4 <= n && start <= positions0 + together; together += 4) {
                    const float *query[4];
                    for (int i = 0; i < 4; ++i) query[i] = q + ((together + i) * H + h) * D;
                    tile_scores_4(query, tile_keys, D, (float (*)[PAW_FA_TILE])(row_scores + together * PAW_FA_TILE));
                }
            for (int64_t r = 0; r < together; ++r)
                tile_softmax(row_scores + r * PAW_FA_TILE, start, length, positions0 + r, scale, W, D, out + (r * H + h) * D, highs + r, totals + r);
            for (int64_t r0 = 0; r0 < together; r0 += 4) {
                float *result[4];
                for (int i = 0; i < 4; ++i) result[i] = out + ((r0 + i) * H + h) * D;
                tile_values_4(row_scores + r0 * PAW_FA_TILE, PAW_FA_TILE, 1, tile_values, D, result);
            }
            for (int64_t r0 = together; r0 < n; r0 += 4) {
                const int count = n - r0 < 4 ? (int)(n - r0) : 4;
                const float *query[4];
                float *result[4];
                for (int i = 0; i < count; ++i) {
                    query[i] = q + ((r0 + i) * H + h) * D;
                    result[i] = out + ((r0 + i) * H + h) * D;
                }
                for (int i = 0; i < count; ++i) {
                    const int64_t r = r0 + i;
                    if (start > positions0 + r) continue;
                    float *row = scores[i];
                    for (int c = 0; c < PAW_FA_TILE; ++c) row[c] = 0.0f;
                    for (int64_t d = 0; d < D; ++d)
                        for (int c = 0; c < PAW_FA_TILE; ++c) row[c] = fmaf(query[i][d], tile_keys[d * PAW_FA_TILE + c], row[c]);
                    tile_softmax(row, start, length, positions0 + r, scale, W, D, result[i], highs + r, totals + r);
                    for (int c = 0; c < PAW_FA_TILE; ++c)
                        for (int64_t d = 0; d < D; ++d) result[i][d] = fmaf(row[c], tile_values[c * D + d], result[i][d]);
                }
            }
        }
        normalize_head(out, totals, n, H, h, D);
    }
done:
    free(tile_keys);
    free(tile_values);
    free(highs);
    free(totals);
    free(row_scores);
}

/* ---- float matrices (F32, F16 and BF16 GGUF weights, float adapters) as llama.cpp's CPU backend multiplies them ---- */

enum { FLOAT_F32, FLOAT_F16, FLOAT_BF16_PAIRS, FLOAT_BF16_WIDENED };  /* paw_args' `kind` of a float product */

static inline float bf16_value(uint16_t bits) {
    uint32_t widened = (uint32_t)bits << 16;
    float value;
    memcpy(&value, &widened, sizeof value);
    return value;
}

/* `vdpbf16ps` treats inputs below FLT_MIN as zero and flushes such results to zero. */
static inline float flushed(float value) { return fabsf(value) < 0x1p-126f ? copysignf(0.0f, value) : value; }

/* One `vdpbf16ps` lane: the odd pair's product added, then the even's, each an FMA rounded once (DAZ, FTZ). */
static inline float dpbf16_lane(float acc, const float *a, const float *b) {
    acc = flushed(fmaf(flushed(a[1]), flushed(b[1]), flushed(acc)));
    return flushed(fmaf(flushed(a[0]), flushed(b[0]), acc));
}

/* a . b over k bf16 values (widened to float32) as llama.cpp dots them on this CPU, one lane at a time: `pairs`
   (AVX-512 BF16) in `vdpbf16ps` lanes of 16, else FMA chains of W lanes. `tiled` (tinyBLAS, k a multiple of its
   step): one accumulator, by halves. Else `ggml_vec_dot_bf16`: two accumulators (of 32 values a step with pairs,
   16 with AVX-512) each by halves and added in double, or four of 8 (AVX2) added (0+2)+(1+3), then by halves; the
   last values' products added in double. */
static float dot_bf16_lanes(const float *a, const float *b, int64_t k, int W, int pairs, int tiled) {
    float lanes[4][16] = {{0}};
    const int accumulators = tiled ? 1 : (pairs || W == 16 ? 2 : 4), step = pairs ? 32 : (tiled ? W : (W == 16 ? 16 : 8));
    const int64_t block = (int64_t)accumulators * step, whole = k - k % block;
    for (int64_t s = 0; s < whole; s += block)
        for (int j = 0; j < accumulators; ++j) {
            const float *pa = a + s + j * step, *pb = b + s + j * step;
            if (pairs)
                for (int l = 0; l < 16; ++l) lanes[j][l] = dpbf16_lane(lanes[j][l], pa + 2 * l, pb + 2 * l);
            else
                for (int l = 0; l < step; ++l) lanes[j][l] = fmaf(pa[l], pb[l], lanes[j][l]);
        }
    if (tiled) return halves(lanes[0], pairs ? 16 : W);
    double total;
    if (accumulators == 4) {
        for (int l = 0; l < 8; ++l) lanes[0][l] = (lanes[0][l] + lanes[2][l]) + (lanes[1][l] + lanes[3][l]);
        total = (double)halves(lanes[0], 8);
    } else {
        total = (double)halves(lanes[0], 16);
        total += (double)halves(lanes[1], 16);
    }
    for (int64_t i = whole; i < k; ++i) total += (double)(a[i] * b[i]);
    return (float)total;
}

enum { TILES_F32, TILES_F16, TILES_BF16_WIDENED };  /* widened tiles' weights: F32, F16 (x float32), BF16 (x bf16 bits) */

/* A tile's values (row i's outputs at each + 4i) for rows r.. r + rc and outputs o.. o + oc, as `put` puts them. */
static inline void put_tile(const paw_out *y, const float *each, int64_t r, int64_t o, int rc, int oc) {
    if (oc < 4) {
        for (int j = 0; j < oc; ++j)
            for (int i = 0; i < rc; ++i) put(y, r + i, o + j, each[4 * i + j]);
        return;
    }
    for (int i = 0; i < rc; ++i) {
        float *target = y->y + (r + i) * y->stride + o;
        __m128 value = _mm_loadu_ps(each + 4 * i);
        if (y->accumulate) value = _mm_add_ps(_mm_loadu_ps(target), _mm_mul_ps(value, _mm_set1_ps(y->alpha)));
        else if (y->bias) value = _mm_add_ps(value, _mm_loadu_ps(y->bias + o));
        _mm_storeu_ps(target, value);
    }
}

/* Eight values from `p` + s as float32, exactly: F32 as they are, F16 widened, bf16 bits each shifted into a float's
   top half. */
static inline __attribute__((always_inline)) __m256 widened_8(const void *p, int64_t s, int kind) {
    if (kind == TILES_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + s)));
    if (kind == TILES_BF16_WIDENED)
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + s))), 16));
    return _mm256_loadu_ps((const float *)p + s);
}

/* One tile's tinyBLAS dots over k (four weight rows by up to four rows of x), each summed by halves: row i, output j
   at each[4i + j]. */
typedef void (*tile_dots)(const void *const w[4], const void *const x[4], int64_t k, float each[16]);

/* x [rows, k] times w [out, k] (elements of `w_size` and `x_size` bytes) for outputs [first, last): four weight rows
   by `height` rows of x at once through `dots`, rows in blocks of 64 that stay in L2 while every weight row of the
   range passes. Inlined into each kind's wrapper, its `dots` with it. */
static inline __attribute__((always_inline)) void float_tiles(const void *w, int64_t w_size, const void *x, int64_t x_size, int64_t rows, int64_t k,
                                                             const paw_out *y, int64_t first, int64_t last, const int height, tile_dots dots) {
    for (int64_t r0 = 0; r0 < rows; r0 += 64) {
        const int64_t r_end = r0 + 64 < rows ? r0 + 64 : rows;
        for (int64_t o = first; o < last; o += 4) {
            const int oc = last - o < 4 ? (int)(last - o) : 4;
            const void *wr[4];
            for (int j = 0; j < 4; ++j) wr[j] = (const char *)w + (o + (j < oc ? j : oc - 1)) * k * w_size;
            for (int64_t r = r0; r < r_end; r += height) {
                const int rc = r_end - r < height ? (int)(r_end - r) : height;
                const void *xr[4];
                for (int i = 0; i < 4; ++i) xr[i] = (const char *)x + (r + (i < rc ? i : rc - 1)) * k * x_size;
                float each[16];
                dots(wr, xr, k, each);
                put_tile(y, each, r, o, rc, oc);
            }
        }
    }
}

/* tinyBLAS's float dots on 8 lanes (AVX2) for four weight rows by two rows of x, values widened as they load: each dot
   one register of FMA chains over k in order, summed by halves (dot4_tiled's numbers, and dot_f16's on F16 weights;
   those loaded a weight row a product, or two values a product for F16). k a multiple of 8. */
static inline __attribute__((always_inline)) void widened_dots_2x4(const void *const w[4], const void *const x[4], int64_t k, float each[16],
                                                                  const int weights) {
    const int x_kind = weights == TILES_BF16_WIDENED ? TILES_BF16_WIDENED : TILES_F32;
    __m256 acc[2][4];
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 4; ++j) acc[i][j] = _mm256_setzero_ps();
    for (int64_t s = 0; s < k; s += 8) {
        __m256 wv[4], xv[2];
        for (int j = 0; j < 4; ++j) wv[j] = widened_8(w[j], s, weights);
        for (int i = 0; i < 2; ++i) xv[i] = widened_8(x[i], s, x_kind);
        for (int j = 0; j < 4; ++j)
            for (int i = 0; i < 2; ++i) acc[i][j] = _mm256_fmadd_ps(xv[i], wv[j], acc[i][j]);
    }
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 4; ++j) each[4 * i + j] = sum_halves(acc[i][j]);
}

static inline __attribute__((always_inline)) void f32_dots_2x4(const void *const w[4], const void *const x[4], int64_t k, float each[16]) {
    widened_dots_2x4(w, x, k, each, TILES_F32);
}

static inline __attribute__((always_inline)) void f16_dots_2x4(const void *const w[4], const void *const x[4], int64_t k, float each[16]) {
    widened_dots_2x4(w, x, k, each, TILES_F16);
}

static inline __attribute__((always_inline)) void bf16_widened_dots_2x4(const void *const w[4], const void *const x[4], int64_t k, float each[16]) {
    widened_dots_2x4(w, x, k, each, TILES_BF16_WIDENED);
}

static void tiles_256(const void *w, const void *x, int64_t rows, int64_t k, const paw_out *y, int64_t first, int64_t last, int weights) {
    if (weights == TILES_F16)
        float_tiles(w, 2, x, 4, rows, k, y, first, last, 2, f16_dots_2x4);
    else if (weights == TILES_BF16_WIDENED)
        float_tiles(w, 2, x, 2, rows, k, y, first, last, 2, bf16_widened_dots_2x4);
    else
        float_tiles(w, 4, x, 4, rows, k, y, first, last, 2, f32_dots_2x4);
}

#ifndef PAW_BASELINE
static int has_avx512_bf16(void) {
    static int known = -1;
    if (known < 0) {
        __builtin_cpu_init();
        known = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
    }
    return known;
}

#define BF16_TARGET __attribute__((target("avx512f,avx512bf16")))

/* tinyBLAS's BF16 dots with `vdpbf16ps` (its AVX-512 BF16 kernel's instruction, so the same numbers). */
BF16_TARGET static inline __attribute__((always_inline)) void bf16_dots_4x4(const void *const w[4], const void *const x[4], int64_t k, float each[16]) {
    __m512 sums[16];
    for (int a = 0; a < 16; ++a) sums[a] = _mm512_setzero_ps();
    for (int64_t s = 0; s < k; s += 32) {
        __m512bh wv[4], xv[4];
        for (int j = 0; j < 4; ++j) wv[j] = (__m512bh)_mm512_loadu_si512((const uint16_t *)w[j] + s);
        for (int i = 0; i < 4; ++i) xv[i] = (__m512bh)_mm512_loadu_si512((const uint16_t *)x[i] + s);
        for (int j = 0; j < 4; ++j)
            for (int i = 0; i < 4; ++i) sums[4 * i + j] = _mm512_dpbf16_ps(sums[4 * i + j], wv[j], xv[i]);
    }
    sum_halves_16x512(sums, each);
}

/* Sixteen values from `p` + s as float32, exactly: F32 as they are, F16 widened, bf16 bits each shifted into a float's
   top half. */
__attribute__((target("avx512f"))) static inline __attribute__((always_inline)) __m512 widened_16(const void *p, int64_t s, int kind) {
    if (kind == TILES_F16) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + s)));
    if (kind == TILES_BF16_WIDENED)
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + s))), 16));
    return _mm512_loadu_ps((const float *)p + s);
}

/* tinyBLAS's float dots on 16 lanes, values widened as they load: each dot one register of FMA chains over k in order
   (dot8_tiled_512's numbers, and dot_f16's on F16 weights and x already rounded to f16; dot8_tiled_512 loads a weight
   row a product: here four rows of x share each load, and the FMAs, not the loads, bound it). */
__attribute__((target("avx512f"))) static inline __attribute__((always_inline)) void widened_dots_4x4(const void *const w[4], const void *const x[4],
                                                                                                    int64_t k, float each[16], int weights) {
    __m512 sums[16];
    for (int a = 0; a < 16; ++a) sums[a] = _mm512_setzero_ps();
    for (int64_t s = 0; s < k; s += 16) {
        __m512 wv[4], xv[4];
        for (int j = 0; j < 4; ++j) wv[j] = widened_16(w[j], s, weights);
        for (int i = 0; i < 4; ++i) xv[i] = widened_16(x[i], s, weights == TILES_BF16_WIDENED ? TILES_BF16_WIDENED : TILES_F32);
        for (int j = 0; j < 4; ++j)
            for (int i = 0; i < 4; ++i) sums[4 * i + j] = _mm512_fmadd_ps(xv[i], wv[j], sums[4 * i + j]);
    }
    sum_halves_16x512(sums, each);
}

__attribute__((target("avx512f"))) static inline __attribute__((always_inline)) void f32_dots_4x4(const void *const w[4], const void *const x[4], int64_t k,
                                                                                                float each[16]) {
    widened_dots_4x4(w, x, k, each, TILES_F32);
}

__attribute__((target("avx512f"))) static inline __attribute__((always_inline)) void f16_dots_4x4(const void *const w[4], const void *const x[4], int64_t k,
                                                                                                float each[16]) {
    widened_dots_4x4(w, x, k, each, TILES_F16);
}

/* llama.cpp's BF16 dots on an AVX-512 CPU without AVX-512 BF16: weights and x widened (dot8_tiled_512's numbers). */
__attribute__((target("avx512f"))) static inline __attribute__((always_inline)) void bf16_widened_dots_4x4(const void *const w[4], const void *const x[4],
                                                                                                         int64_t k, float each[16]) {
    widened_dots_4x4(w, x, k, each, TILES_BF16_WIDENED);
}

/* float_tiles with each kind's dots inlined (a dots function called through its pointer kept its sixteen accumulators in
   memory: BF16 products 25% slower) */
BF16_TARGET static void bf16_tiles_512(const void *w, const void *x, int64_t rows, int64_t k, const paw_out *y, int64_t first, int64_t last) {
    float_tiles(w, 2, x, 2, rows, k, y, first, last, 4, bf16_dots_4x4);
}

__attribute__((target("avx512f"))) static void f32_tiles_512(const void *w, int weights, const void *x, int64_t rows, int64_t k, const paw_out *y,
                                                            int64_t first, int64_t last) {
    if (weights == TILES_BF16_WIDENED)
        float_tiles(w, 2, x, 2, rows, k, y, first, last, 4, bf16_widened_dots_4x4);
    else if (weights == TILES_F16)
        float_tiles(w, 2, x, 4, rows, k, y, first, last, 4, f16_dots_4x4);
    else
        float_tiles(w, 4, x, 4, rows, k, y, first, last, 4, f32_dots_4x4);
}
#endif

static void widen_bf16(const uint16_t *bits, int64_t count, float *out) {
    for (int64_t i = 0; i < count; ++i) out[i] = bf16_value(bits[i]);
}

/* x [rows, k] (bf16 bits, rounded as ggml rounds them) times BF16 weights w [out, k] for outputs [first, last), with
   `pairs` (AVX-512 BF16's `vdpbf16ps` lanes) or widened values in W-lane FMA chains; `tiled` as `float_product`.
   The instruction where the CPU has it, else the same numbers lane by lane. Returns 0, or -1 without memory. */
static int bf16_product(const uint16_t *w, int pairs, const uint16_t *x, int64_t rows, int64_t k, int tiled, int W,
                        const paw_out *y, int64_t first, int64_t last) {
    if (k % (pairs ? 32 : W)) tiled = 0;  /* tinyBLAS takes only whole vectors; ggml then dots row by row */
#ifndef PAW_BASELINE
    if (tiled && pairs && avx512_allowed && has_avx512_bf16()) {
        bf16_tiles_512(w, x, rows, k, y, first, last);
        return 0;
    }
    if (tiled && !pairs && W == 16 && avx512_on()) {  /* a 16-lane llama.cpp without AVX-512 BF16: widened, in tiles */
        f32_tiles_512(w, TILES_BF16_WIDENED, x, rows, k, y, first, last);
        return 0;
    }
#endif
    if (tiled && !pairs && W == 8) {  /* an 8-lane (AVX2) llama.cpp: widened, in tiles */
        tiles_256(w, x, rows, k, y, first, last, TILES_BF16_WIDENED);
        return 0;
    }
    float *wide = malloc(sizeof(float) * k * 9);  /* 8 weight rows and one row of x */
    if (!wide) return -1;
    for (int64_t o = first; o < last; o += 8) {
        const int count = last - o < 8 ? (int)(last - o) : 8;
        const float *b[8];
        for (int j = 0; j < 8; ++j) {
            b[j] = wide + j * k;
            widen_bf16(w + (o + (j < count ? j : count - 1)) * k, k, wide + j * k);
        }
        for (int64_t r = 0; r < rows; ++r) {
            float *a = wide + 8 * k, result[8];
            widen_bf16(x + r * k, k, a);
            if (tiled && !pairs)
                dots_tiled(a, b, count, k, W, result);
            else
                for (int j = 0; j < count; ++j) result[j] = dot_bf16_lanes(a, b[j], k, W, pairs, tiled);
            for (int j = 0; j < count; ++j) put(y, r, o + j, result[j]);
        }
    }
    free(wide);
    return 0;
}

/* x [rows, k] times weights w [out, k] for outputs [first, last): F32 weights, or (`FLOAT_F16`) f16 bits with x
   already rounded to f16 as ggml converts it, or BF16 (`bf16_product`). `tiled` (2 rows or more, k a multiple of W:
   tinyBLAS) each dot W lanes in order, then by halves; else ggml's one-row dots (`ggml_vec_dot_f32` / `_f16`). */
static void float_product(const void *w, int kind, const void *x, int64_t rows, int64_t k, int tiled, int W,
                          const paw_out *y, int64_t first, int64_t last) {
    if (kind == FLOAT_BF16_PAIRS || kind == FLOAT_BF16_WIDENED) {
        bf16_product(w, kind == FLOAT_BF16_PAIRS, x, rows, k, tiled, W, y, first, last);
        return;
    }
#ifndef PAW_BASELINE
    if ((kind == FLOAT_F32 || kind == FLOAT_F16) && tiled && W == 16 && k % 16 == 0 && avx512_on()) {  /* tinyBLAS: whole vectors */
        f32_tiles_512(w, kind == FLOAT_F16 ? TILES_F16 : TILES_F32, x, rows, k, y, first, last);
        return;
    }
#endif
    if ((kind == FLOAT_F32 || kind == FLOAT_F16) && tiled && W == 8 && k % 8 == 0) {
        tiles_256(w, x, rows, k, y, first, last, kind == FLOAT_F16 ? TILES_F16 : TILES_F32);
        return;
    }
    const int f16 = kind == FLOAT_F16;
    for (int64_t o = first; o < last; o += 8) {
        int count = last - o < 8 ? (int)(last - o) : 8;
        const float *b[8] = {0};
        for (int j = 0; j < 8 && !f16; ++j) b[j] = (const float *)w + (o + (j < count ? j : count - 1)) * k;
        for (int64_t r = 0; r < rows; ++r) {
            const float *a = (const float *)x + r * k;
            float result[8];
            if (f16)
                for (int j = 0; j < count; ++j) result[j] = dot_f16(a, (const uint16_t *)w + (o + j) * k, k, W, !tiled);
            else if (tiled)
                dots_tiled(a, b, count, k, W, result);
            else
                for (int j = 0; j < count; ++j) result[j] = dot_f32_ggml(a, b[j], k, W);
            for (int j = 0; j < count; ++j) put(y, r, o + j, result[j]);
        }
    }
}

/* ---- elementwise steps of a layer (one call each instead of a dozen torch operations) ---- */

/* `ggml_rms_norm` then `ggml_mul` on rows [first, last) of a view whose rows of n are contiguous, row r at
   x + (r / per) * stride + (r % per) * n (a [T, per, n] view, e.g. heads of a wider product's columns), into y
   [rows, n]: squares (float32) summed in order in double, mean = sum / n rounded to float32, scale =
   1 / sqrtf(mean + eps), y = (x * scale) * w. Eight rows at once, each in its own lane (element i of the eight
   rows transposed into one register), so eight in-order chains run side by side. */
static void rms_norm_rows(const float *x, int64_t stride, int64_t per, const float *w, float *y, int64_t n, float eps,
                          int64_t first, int64_t last) {
    for (int64_t r0 = first; r0 < last; r0 += 8) {
        const int count = last - r0 < 8 ? (int)(last - r0) : 8;
        const float *v[8];
        for (int k = 0; k < 8; ++k) {  /* a short group repeats its first row in the unused lanes */
            const int64_t r = r0 + (k < count ? k : 0);
            v[k] = x + (r / per) * stride + (r % per) * n;
        }
        __m256d low = _mm256_setzero_pd(), high = _mm256_setzero_pd();  /* rows 0..3 and 4..7 */
        int64_t i = 0;
        for (; i + 8 <= n; i += 8) {
            __m256 e[8];
            for (int k = 0; k < 8; ++k) e[k] = _mm256_loadu_ps(v[k] + i);
            transpose_8x8(e);  /* e[j]: element i + j of the eight rows */
            for (int j = 0; j < 8; ++j) {
                const __m256 square = _mm256_mul_ps(e[j], e[j]);
                low = _mm256_add_pd(low, _mm256_cvtps_pd(_mm256_castps256_ps128(square)));
                high = _mm256_add_pd(high, _mm256_cvtps_pd(_mm256_extractf128_ps(square, 1)));
            }
        }
        double sums[8];
        _mm256_storeu_pd(sums, low);
        _mm256_storeu_pd(sums + 4, high);
        for (; i < n; ++i)
            for (int k = 0; k < 8; ++k) sums[k] += (double)(v[k][i] * v[k][i]);
        for (int k = 0; k < count; ++k) {
            const float mean = (float)(sums[k] / (double)n);
            const float scale = 1.0f / sqrtf(mean + eps);
            float *out = y + (r0 + k) * n;
            for (int64_t j = 0; j < n; ++j) out[j] = (v[k][j] * scale) * w[j];
        }
    }
}

/* `ggml_norm` then `ggml_mul` and `ggml_add` on x [rows, n] into y: the mean from the values summed in order in
   double (`ggml_vec_sum_f32`), rounded to float32 and divided by n; the centred values' squares summed W at a time,
   each W by halves (`ggml_vec_cvar_f32`), the rest one by one, in double; scale = 1 / sqrtf(variance + eps); then
   (centred * scale) * w + b, each step rounded. Rows split across OpenMP's team (torch's thread count) when many. */
void paw_layer_norm(const float *x, const float *w, const float *b, float *y, int64_t rows, int64_t n, float eps, int64_t W) {
#ifdef _OPENMP
#pragma omp parallel for if (rows * n >= (1 << 16))
#endif
    for (int64_t r = 0; r < rows; ++r) {
        const float *row = x + r * n;
        float *out = y + r * n;
        double sum = 0.0;
        for (int64_t i = 0; i < n; ++i) sum += (double)row[i];
        const float mean = (float)sum / (float)n;
        const __m256 mean8 = _mm256_set1_ps(mean);
        double squares = 0.0;
        int64_t i = 0;
        for (; i + W <= n; i += W) {
            __m256 low = _mm256_sub_ps(_mm256_loadu_ps(row + i), mean8);
            _mm256_storeu_ps(out + i, low);
            low = _mm256_mul_ps(low, low);
            if (W == 16) {
                __m256 high = _mm256_sub_ps(_mm256_loadu_ps(row + i + 8), mean8);
                _mm256_storeu_ps(out + i + 8, high);
                low = _mm256_add_ps(_mm256_mul_ps(high, high), low);
            }
            squares += (double)sum_halves(low);
        }
        for (; i < n; ++i) {
            const float centred = row[i] - mean;
            out[i] = centred;
            squares += (double)(centred * centred);
        }
        const float variance = (float)(squares / (double)n);
        const float scale = 1.0f / sqrtf(variance + eps);
        for (int64_t j = 0; j < n; ++j) out[j] = out[j] * scale * w[j] + b[j];
    }
}

/* `rotate_pairs` (NeoX halves) of x [tokens, heads, dim] with cos/sin [tokens, dim/2]: x0*cos - x1*sin and
   x0*sin + x1*cos, the first product of each fused with the rounded second (GCC's contraction in ggml). Head (t, h)
   read at x + t * x_token + h * x_head (a wider product's columns in place) and written at y + t * y_token + h *
   y_head, as float32, or (`f16`) rounded to f16 to nearest even as ggml's cast rounds it (F16C's conversion). */
void paw_rope_neox(const float *x, int64_t x_token, int64_t x_head, const float *cos_table, const float *sin_table, void *y,
                   int64_t y_token, int64_t y_head, int f16, int64_t tokens, int64_t heads, int64_t dim) {
    int64_t half = dim / 2;
    for (int64_t t = 0; t < tokens; ++t) {
        const float *c = cos_table + t * half, *s = sin_table + t * half;
        for (int64_t h = 0; h < heads; ++h) {
            const float *v = x + t * x_token + h * x_head;
            float *out = (float *)y + t * y_token + h * y_head;
            uint16_t *bits = (uint16_t *)y + t * y_token + h * y_head;
            for (int64_t i = 0; i < half; ++i) {
                float x0 = v[i], x1 = v[i + half];
                const float first = fmaf(x0, c[i], -(x1 * s[i])), second = fmaf(x0, s[i], x1 * c[i]);
                if (f16) {
                    bits[i] = _cvtss_sh(first, 0);
                    bits[i + half] = _cvtss_sh(second, 0);
                } else {
                    out[i] = first;
                    out[i + half] = second;
                }
            }
        }
    }
}

/* `ggml_rope_cache_init`'s angles and their cosines and sines: for each of `count` positions (float32) the angles
   p, p * step, (p * step) * step, ... (`half` of them, each product rounded to float32), then the C library's cosf
   and sinf of each; cos and sin [count, half]. */
void paw_rope_table(const float *positions, int64_t count, int64_t half, float step, float *cos_out, float *sin_out) {
    for (int64_t t = 0; t < count; ++t) {
        float angle = positions[t];
        for (int64_t i = 0; i < half; ++i) {
            if (i) angle = angle * step;
            cos_out[t * half + i] = cosf(angle);
            sin_out[t * half + i] = sinf(angle);
        }
    }
}

/* `ggml_swiglu`: gate / (1 + expf(-gate)) * up with ggml_v_expf (W lanes), for rows [first, last) of n values
   (gate and up rows `stride` floats apart, e.g. the halves of one product's columns), into y [rows, n]. */
/* `ggml_v_silu` on eight values, x / (1 + expf(-x)) with `ggml_v_expf` for `width` lanes (each lane as expf_ggml). */
static inline __m256 silu_ggml8(__m256 x, int width) {
    float minus[8], e[8];
    _mm256_storeu_ps(minus, _mm256_xor_ps(x, _mm256_set1_ps(-0.0f)));
    expf_ggml8(minus, e, width);
    return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), _mm256_loadu_ps(e)));
}

/* The whole sixteens of a row of swiglu_rows (W = 16, AVX-512), each lane as silu_ggml8's; returns how many. */
__attribute__((target("avx512f"))) static int64_t swiglu_16(const float *gate, const float *up, float *out, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, _mm512_mul_ps(silu_ggml16(_mm512_loadu_ps(gate + i)), _mm512_loadu_ps(up + i)));
    return i;
}

/* silu_rows' whole vectors for W = 16 (AVX-512): n a multiple of 16 there. */
__attribute__((target("avx512f"))) static void silu_16(const float *x, float *y, int64_t whole) {
    for (int64_t i = 0; i < whole; i += 16) _mm512_storeu_ps(y + i, silu_ggml16(_mm512_loadu_ps(x + i)));
}

static void swiglu_rows(const float *gate, const float *up, int64_t stride, float *y, int64_t n, int width, int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
        const float *g_row = gate + r * stride, *u_row = up + r * stride;
        float *out = y + r * n;
        int64_t i = 0;
        if (width == 16 && avx512_on()) i = swiglu_16(g_row, u_row, out, n);
        for (; i + 8 <= n; i += 8)  /* each lane as the scalar steps below (IEEE division, rounded once) */
            _mm256_storeu_ps(out + i, _mm256_mul_ps(silu_ggml8(_mm256_loadu_ps(g_row + i), width), _mm256_loadu_ps(u_row + i)));
        for (; i < n; ++i) out[i] = (g_row[i] / (1.0f + expf_ggml(-g_row[i], width))) * u_row[i];
    }
}

/* `ggml_vec_silu_f32` on rows of n values: the whole vectors of `width` lanes as `ggml_v_silu` (silu_ggml8), the rest
   as `ggml_silu_f32` with the C library's expf. Rows [first, last) of x, row r at x + (r / per) * stride + (r % per) *
   n (a [T, per, n] view of a wider product's columns), into y [rows, n]; y may be x where they are laid out alike. */
static void silu_rows(const float *x, int64_t stride, int64_t per, float *y, int64_t n, int width, int64_t first, int64_t last) {
    const int64_t whole = n - n % width;
    for (int64_t r = first; r < last; ++r) {
        const float *row = x + (r / per) * stride + (r % per) * n;
        float *out = y + r * n;
        int64_t i = 0;
        if (width == 16 && avx512_on()) {
            silu_16(row, out, whole);
            i = whole;
        }
        for (; i < whole; i += 8) _mm256_storeu_ps(out + i, silu_ggml8(_mm256_loadu_ps(row + i), width));
        for (; i < n; ++i) out[i] = row[i] / (1.0f + expf(-row[i]));
    }
}

/* `ggml_vec_gelu_f32` as built (GGML_GELU_FP16), values [first, last): 0 at or below -10, x at or above 10, else
   `table` (ggml_table_gelu_f16 as float32, by f16 bits) at x rounded to f16 to nearest even (GGML_FP32_TO_FP16). */
static void gelu_values(const float *x, const float *table, float *y, int64_t first, int64_t last) {
    const __m256 high = _mm256_set1_ps(10.0f), low = _mm256_set1_ps(-10.0f);
    int64_t i = first;
    for (; i + 8 <= last; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m256 looked = _mm256_i32gather_ps(table, _mm256_cvtepu16_epi32(_mm256_cvtps_ph(v, 0)), 4);
        __m256 kept = _mm256_blendv_ps(looked, v, _mm256_cmp_ps(v, high, _CMP_GE_OQ));
        _mm256_storeu_ps(y + i, _mm256_andnot_ps(_mm256_cmp_ps(v, low, _CMP_LE_OQ), kept));  /* +0 at or below -10 */
    }
    for (; i < last; ++i) y[i] = x[i] <= -10.0f ? 0.0f : x[i] >= 10.0f ? x[i] : table[_cvtss_sh(x[i], 0)];
}

/* Rows past a multiple of sixteen that the one-row kernel takes rather than a group padded to sixteen: one row costs
   ~1/6 of a padded group's time over 1024-wide inputs (1024 -> 7168 or 8224) and ~1/5 over wider ones (2048 or 3584
   -> 1024), one core of an AMD EPYC (Zen 4), ad hoc */
#define LANES_TAIL 4
#define LANES_TAIL_NARROW 8  /* inputs of 32 blocks or fewer */

/* ---- `paw_run`: a kernel's range [0, count) split across threads (ctypes releases the GIL for the call) ---- */

typedef struct {
    const void *p[10];
    int64_t i[10];
    float f;
} paw_args;

enum {
    KERNEL_Q6_K_ROWS, KERNEL_Q6_K_TILED, KERNEL_Q0_ROWS, KERNEL_Q4_0_REPACKED, KERNEL_ATTENTION, KERNEL_Q0_EIGHTS, KERNEL_GATED_DELTA_NET, KERNEL_FLASH_ONLINE, KERNEL_FLASH_TILED, KERNEL_FLOAT,
    KERNEL_Q4_0_EIGHTS, KERNEL_ATTENTION_STEP, KERNEL_RMS_NORM, KERNEL_SWIGLU, KERNEL_GELU, KERNEL_SSM_CONV,
    KERNEL_SILU
};

static void run_range(int kernel, const paw_args *a, int64_t first, int64_t last) {
    switch (kernel) {
    case KERNEL_Q6_K_ROWS:
    case KERNEL_Q6_K_TILED:
#ifndef PAW_BASELINE
        if (kernel == KERNEL_Q6_K_TILED && a->p[7] != NULL) {  /* the rows' scales laid out by block: AVX-512 */
            q6_k_tiled_512(a->p[0], a->p[1], a->p[2], a->p[3], a->p[7], a->p[6], a->i[0], a->i[1], first, last);
            break;
        }
#endif
        (kernel == KERNEL_Q6_K_ROWS ? (avx512_on() ? q6_k_rows_512 : q6_k_rows) : q6_k_tiled)(
            a->p[0], a->p[1], a->p[2], a->p[3], a->p[4], a->p[5], a->p[6], a->i[0], a->i[1], first, last);
        break;
    case KERNEL_Q0_ROWS:
    case KERNEL_Q4_0_REPACKED:
        (kernel == KERNEL_Q0_ROWS ? q0_rows : q4_0_repacked)(
            a->p[0], a->p[2], a->p[3], a->p[4], a->p[6], a->i[0], a->i[1], first, last);
        break;
    case KERNEL_Q0_EIGHTS:
    case KERNEL_Q4_0_EIGHTS:
#ifndef PAW_BASELINE
        if (a->i[2]) {  /* the rows laid out in lanes by sixteens: AVX-512; the last few rows (i[3]) one at a time */
            const int64_t tail = a->i[3], lane_rows = a->i[1] - tail;
            q0_eights_lanes_512(a->p[0], a->p[1], a->p[3], a->p[7], a->p[6], a->i[0], lane_rows, first, last, kernel == KERNEL_Q4_0_EIGHTS);
            if (tail)
                q0_eights_512(a->p[0], a->p[1], (const int8_t *)a->p[8] + lane_rows * a->i[0] * 32, (const float *)a->p[4] + lane_rows * a->i[0],
                              a->p[9], a->i[0], tail, first, last, kernel == KERNEL_Q4_0_EIGHTS);
            break;
        }
#endif
        (avx512_on() ? q0_eights_512 : q0_eights)(a->p[0], a->p[1], a->p[3], a->p[4], a->p[6], a->i[0], a->i[1], first, last,
                                                  kernel == KERNEL_Q4_0_EIGHTS);
        break;
    case KERNEL_GATED_DELTA_NET:
        gated_delta_net(a->p[0], a->p[1], a->p[2], a->i[4], a->p[3], a->p[4], (float *)a->p[5], (float *)a->p[6], a->i[0], a->i[1], a->i[2],
                        (int)a->i[3], first, last);
        break;
    case KERNEL_FLASH_ONLINE:
        flash_online(a->p[0], a->p[1], a->p[2], a->i[0], a->i[1], a->i[2], a->i[3], a->i[4], a->i[5], a->i[6], a->i[7], a->f,
                     (int)a->i[8], (float *)a->p[3], (float *)a->p[4], (float *)a->p[5], first, last);
        break;
    case KERNEL_FLASH_TILED:
        flash_tiled(a->p[0], a->p[1], a->p[2], a->i[0], a->i[1], a->i[2], a->i[3], a->i[4], a->i[5], a->i[6], a->f, (int)a->i[7],
                    (float *)a->p[3], first, last);
        break;
    case KERNEL_FLOAT:
        float_product(a->p[0], (int)a->i[0], a->p[1], a->i[1], a->i[2], (int)a->i[3], (int)a->i[4], a->p[2], first, last);
        break;
    case KERNEL_ATTENTION_STEP:
        attention_step(a->p[0], a->p[3], a->i[5], a->p[4], a->i[6], a->p[1], (float *)a->p[2], a->i[0], a->i[1], a->i[2], a->i[3], a->f,
                       (int)a->i[4], first, last);
        break;
    case KERNEL_RMS_NORM:
        rms_norm_rows(a->p[0], a->i[0], a->i[1], a->p[1], (float *)a->p[2], a->i[2], a->f, first, last);
        break;
    case KERNEL_SWIGLU:
        swiglu_rows(a->p[0], a->p[1], a->i[0], (float *)a->p[2], a->i[1], (int)a->i[2], first, last);
        break;
    case KERNEL_GELU:
        gelu_values(a->p[0], a->p[1], (float *)a->p[2], first, last);
        break;
    case KERNEL_SSM_CONV:
        ssm_conv_steps(a->p[0], a->p[1], a->i[5], a->p[2], (float *)a->p[3], a->i[0], a->i[1], a->i[2], (int)a->i[3], (int)a->i[4], first, last);
        break;
    case KERNEL_SILU:
        silu_rows(a->p[0], a->i[2], a->i[3], (float *)a->p[1], a->i[0], (int)a->i[1], first, last);
        break;
    case KERNEL_ATTENTION:
        paw_attention(a->p[0], a->p[1], a->p[2], a->i[0], a->i[1], a->p[3], a->p[4], a->i[2], a->i[3], (float *)a->p[5],
                      a->i[4], a->i[5], a->i[6], a->i[7], a->i[8], a->f, a->i[9], first, last);
        break;
    }
}

/* Run `kernel` over [0, count) in `threads` parts on OpenMP's team. Linked against `libgomp.so.1`, which the
   dynamic loader resolves to the copy torch has already loaded: torch's threads run these parts too, so the two
   never compete for the cores (a pool of our own spun against torch's after every torch operation). */
int paw_run(int kernel, const paw_args *args, int64_t count, int64_t threads) {
    if (threads <= 1) {
        run_range(kernel, args, 0, count);
        return 0;
    }
#ifdef _OPENMP
    /* up to eight parts a thread, each taken by the next thread free: a core slowed by other work (a shared machine)
       no longer holds the others at the barrier with half of the outputs */
    const int64_t parts = count < threads * 8 ? count : threads * 8;
    int64_t next = 0;
#pragma omp parallel num_threads(threads)
    for (;;) {
        int64_t part;
#pragma omp atomic capture
        part = next++;
        if (part >= parts) break;
        run_range(kernel, args, count * part / parts, count * (part + 1) / parts);
    }
#else
    run_range(kernel, args, 0, count);  /* built without OpenMP (a compiler without its runtime): one thread */
#endif
    return 0;
}

/* Rows [first, last) of x quantized as the weights' partner (Q8_K with code sums, or Q8_0); those before `lane_rows`
   (0: none) also laid out as the AVX-512 kernels with the rows in lanes read them: scales by block ([blocks][padded rows]) and
   codes made unsigned, by quads of sixteen rows ([group][block][quad][row][4]). */
static void prepare_rows(const float *x, int64_t in, int64_t blocks, int k_quant, int64_t lane_rows, int8_t *codes, float *x_scale,
                         int16_t *sums, uint8_t *xq, float *x_scale_t, int64_t padded, int64_t first, int64_t last) {
    if (first >= last) return;
    if (k_quant) paw_quantize_q8_k(x + first * in, last - first, in, codes + first * in, x_scale + first * blocks, sums + first * blocks * 16);
    else paw_quantize_q8_0(x + first * in, last - first, in, codes + first * in, x_scale + first * blocks);
    const int64_t quads = in / blocks / 4;  /* a block's quads: 64 (Q8_K) or 8 (Q8_0) */
    for (int64_t r = first; r < last && r < lane_rows; ++r)
        for (int64_t b = 0; b < blocks; ++b) {
            x_scale_t[b * padded + r] = x_scale[r * blocks + b];
            uint8_t *target_quads = xq + ((r / 16 * blocks + b) * quads * 16 + r % 16) * 4;
            const int8_t *source = codes + r * in + b * quads * 4;
            for (int64_t quad = 0; quad < quads; ++quad) {  /* + 128 on each of four bytes: their top bits flipped */
                uint32_t four;
                memcpy(&four, source + 4 * quad, 4);
                four ^= 0x80808080u;
                memcpy(target_quads + quad * 64, &four, 4);
            }
        }
}

/* x [rows, in] (float32, rows contiguous) times a block matrix with `out` outputs, as llama.cpp does: x quantized
   as the weights' partner (Q8_K for Q6_K, Q8_0 for Q4_0/Q8_0), then `kernel` (a product one) over the outputs in
   `threads` parts. Returns 0, or -1 where scratch memory could not be had. */
int paw_block_product(int kernel, const float *x, int64_t rows, int64_t in, const void *w, const int8_t *sub,
                      const float *w_scale, int64_t out, const paw_out *target, int64_t threads) {
    int k_quant = kernel == KERNEL_Q6_K_ROWS || kernel == KERNEL_Q6_K_TILED;
    int64_t blocks = in / (k_quant ? 256 : 32);
    int8_t *codes = malloc((size_t)(rows * in));
    float *x_scale = malloc((size_t)(rows * blocks) * sizeof(float));
    int16_t *sums = k_quant ? malloc((size_t)(rows * blocks * 16) * sizeof(int16_t)) : NULL;
    /* the AVX-512 kernels with the rows in lanes (tiled Q6_K, and Q4_0/Q8_0 eights from 16 rows) read sixteen rows'
       scales of a block at once ([blocks][padded rows]) and their codes made unsigned, by quads of sixteen rows
       ([group][block][quad][row][4]); padded rows are zeros */
    int eights = kernel == KERNEL_Q0_EIGHTS || kernel == KERNEL_Q4_0_EIGHTS;
    int in_lanes = (kernel == KERNEL_Q6_K_TILED || (eights && rows >= 16)) && avx512_on();
    /* a few rows past the last whole sixteen go through the one-row kernel: a group padded to sixteen lanes cost as
       much as sixteen rows (162 rows: 176 rows' work), a row alone about a third of that (the same numbers: each
       kernel computes q0_rows' own) */
    int64_t tail = in_lanes && eights && rows % 16 <= (blocks <= 32 ? LANES_TAIL_NARROW : LANES_TAIL) ? rows % 16 : 0;
    int64_t lane_rows = in_lanes ? rows - tail : 0;
    int64_t padded = (lane_rows + 15) / 16 * 16;
    float *x_scale_t = in_lanes ? aligned_alloc(64, (size_t)(blocks * padded) * sizeof(float)) : NULL;
    uint8_t *xq = in_lanes ? aligned_alloc(64, (size_t)(padded * in)) : NULL;
    int status = -1;
    if (codes != NULL && x_scale != NULL && (sums != NULL || !k_quant) && (!in_lanes || (x_scale_t != NULL && xq != NULL))) {
        if (in_lanes) {
            memset(x_scale_t, 0, (size_t)(blocks * padded) * sizeof(float));
            if (padded > lane_rows) memset(xq + (padded - 16) * in, 0, (size_t)(16 * in));  /* the last group's padded rows */
        }
        /* the rows quantized (and laid out) in parts, one per thread, where there are enough of them */
        int64_t parts = rows * in >= (1 << 16) && threads > 1 ? (threads < rows ? threads : rows) : 1;
#ifdef _OPENMP
#pragma omp parallel num_threads(parts) if (parts > 1)
#endif
        {
#ifdef _OPENMP
            int64_t part = omp_get_thread_num(), count = omp_get_num_threads();
#else
            int64_t part = 0, count = 1;
            (void)parts;  /* one thread without OpenMP */
#endif
            prepare_rows(x, in, blocks, k_quant, lane_rows, codes, x_scale, sums, xq, x_scale_t, padded, rows * part / count,
                         rows * (part + 1) / count);
        }
        paw_out tail_target = {target->y + lane_rows * target->stride, target->stride, target->accumulate, target->alpha, target->bias};
        paw_args args = {{w, sub, w_scale, in_lanes ? (const void *)xq : codes, x_scale, sums, target, x_scale_t, codes, &tail_target},
                         {blocks, rows, in_lanes, tail}, 0.0f};
        status = paw_run(kernel, &args, eights ? out / 8 : out, threads);
    }
    free(codes);
    free(x_scale);
    free(sums);
    free(x_scale_t);
    free(xq);
    return status;
}

/* x [rows, in] (float32) times a Q6_K base matrix (packed codes [out, blocks, 192], sub-block scales, block scales
   as [blocks, out]) with llama.cpp's tiled kernel's roundings, on AMX (`paw_amx_available`; out a multiple of 16):
   x quantized to Q8_K and laid out as B tiles, then `q6_k_amx` over groups of 16 outputs in `threads` parts.
   Returns 0, or -1 where scratch memory could not be had. */
int paw_q6_k_amx_product(const float *x, int64_t rows, int64_t in, const uint8_t *w, const int8_t *sub,
                         const float *w_scale_t, int64_t out, float *y, int64_t threads) {
    int64_t blocks = in / 256, row_tiles = (rows + 15) / 16, padded = row_tiles * 16;
    int8_t *codes = malloc((size_t)(rows * in));
    float *x_scale = malloc((size_t)(rows * blocks) * sizeof(float));
    int16_t *sums = malloc((size_t)(rows * blocks * 16) * sizeof(int16_t));
    int8_t *xv = aligned_alloc(64, (size_t)(padded * in));
    float *x_scale_t = aligned_alloc(64, (size_t)(blocks * padded) * sizeof(float));
    int status = -1;
    if (codes != NULL && x_scale != NULL && sums != NULL && xv != NULL && x_scale_t != NULL) {
        paw_quantize_q8_k(x, rows, in, codes, x_scale, sums);
        memset(xv, 0, (size_t)(padded * in));
        memset(x_scale_t, 0, (size_t)(blocks * padded) * sizeof(float));
        for (int64_t r = 0; r < rows; ++r) {
            int64_t tile = r / 16, within = r % 16;
            for (int64_t b = 0; b < blocks; ++b) {
                x_scale_t[b * padded + r] = x_scale[r * blocks + b];
                for (int quarter = 0; quarter < 4; ++quarter) {
                    /* tile row k holds the 16 rows' codes 4k..4k+3 of the quarter */
                    int8_t *target = xv + ((b * 4 + quarter) * row_tiles + tile) * 1024 + within * 4;
                    const int8_t *source = codes + r * in + b * 256 + quarter * 64;
                    for (int k = 0; k < 16; ++k) memcpy(target + k * 64, source + 4 * k, 4);
                }
            }
        }
        int64_t groups = out / 16;
        status = 0;
#ifdef PAW_BASELINE
        status = -1;  /* never called: paw_amx_available is 0 */
        (void)groups;
#elif defined(_OPENMP)
#pragma omp parallel num_threads(threads > 1 ? threads : 1) reduction(min : status)
        {
            int64_t part = omp_get_thread_num(), parts = omp_get_num_threads();
            status = q6_k_amx(w, sub, w_scale_t, xv, x_scale_t, y, rows, out, blocks, groups * part / parts,
                              groups * (part + 1) / parts);
        }
#else
        status = q6_k_amx(w, sub, w_scale_t, xv, x_scale_t, y, rows, out, blocks, 0, groups);
#endif
    }
    free(codes);
    free(x_scale);
    free(sums);
    free(xv);
    free(x_scale_t);
    return status;
}

/* ---- loading ---- */

/* Q6_K blocks (210 bytes: 128 of low nibbles, 64 of high 2-bit pairs, 16 int8 sub-block scales, an f16 scale) as
   their codes' 192 bytes [count, 192] (as the kernels read them, `q6_k_unpack`), sub-block scales [count, 16] and
   scales [count]. */
void paw_unpack_q6_k(const uint8_t *raw, int64_t count, uint8_t *codes, int8_t *sub, float *d) {
    for (int64_t i = 0; i < count; ++i) {
        const uint8_t *block = raw + i * 210;
        memcpy(codes + i * 192, block, 192);
        memcpy(sub + i * 16, block + 192, 16);
        uint16_t bits;
        memcpy(&bits, block + 208, 2);
        d[i] = _cvtsh_ss(bits);
    }
}

