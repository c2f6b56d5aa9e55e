/* mm_audio.c — Gemma-4's log-mel features (see mm_audio.h) and the soft
 * token count of a clip. The real FFT is a radix-2 complex FFT in double
 * written here (512 or 1024 points per 10 ms frame). Single precision
 * follows the extractor where it computes in float32 (scaling, preemphasis,
 * the window product); the spectrum, the filter bank and the logarithm are
 * double, as numpy computes them (its float32 FFT rounds each magnitude
 * once more: the features agree to about 1e-6). */
#include "model/mm_audio.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/json.h"

/* An int field that fits an int (absent: *out unchanged). */
static int get_small_int(const json_t *o, const char *key, int *out, const char *what, herr *err) {
  int64_t v = *out;
  int rc = hjson_get_int(o, key, false, &v, what, err);
  if (rc) return rc;
  if (v < -(1 << 30) || v > (1 << 30)) return herr_set(err, HEARTH_EFORMAT, "%s: '%s' out of range", what, key);
  *out = (int)v;
  return 0;
}

void gemma4_audio_prep_default(gemma4_audio_prep *p) {
  memset(p, 0, sizeof *p);
  p->feature_size = 128;
  p->sampling_rate = 16000;
  p->frame_length_ms = 20.0;
  p->hop_length_ms = 10.0;
  p->min_frequency = 0.0;
  p->max_frequency = 8000.0;
  p->preemphasis_htk_flavor = true;
  p->input_scale_factor = 1.0;
  p->mel_floor = 1e-3;
  p->pad_to_multiple_of = 128;
  p->max_length = 480000;
}

static int read_bins(const json_t *o, const char *key, int n, double *out, bool *has, const char *what, herr *err) {
  const json_t *a = json_object_get(o, key);
  if (!a || json_is_null(a)) return 0;
  if (!json_is_array(a) || (int)json_array_size(a) != n)
    return herr_set(err, HEARTH_EFORMAT, "%s: '%s' must hold %d numbers", what, key, n);
  for (int i = 0; i < n; i++) {
    const json_t *v = json_array_get(a, (size_t)i);
    if (!json_is_number(v)) return herr_set(err, HEARTH_EFORMAT, "%s: '%s' must hold %d numbers", what, key, n);
    out[i] = json_number_value(v);
  }
  *has = true;
  return 0;
}

int gemma4_audio_prep_load(gemma4_audio_prep *p, const char *dir, herr *err) {
  char path[4096];
  snprintf(path, sizeof path, "%s/preprocessor_config.json", dir);
  if (access(path, R_OK) != 0) return 0;
  json_t *o = hjson_load_file(path, err);
  if (!o) return err ? err->code : HEARTH_EFORMAT;
  int rc = 0;
  if (!rc) rc = get_small_int(o, "feature_size", &p->feature_size, path, err);
  if (!rc) rc = get_small_int(o, "sampling_rate", &p->sampling_rate, path, err);
  if (!rc) rc = hjson_get_num(o, "frame_length_ms", false, &p->frame_length_ms, path, err);
  if (!rc) rc = hjson_get_num(o, "hop_length_ms", false, &p->hop_length_ms, path, err);
  if (!rc) rc = hjson_get_num(o, "min_frequency", false, &p->min_frequency, path, err);
  if (!rc) rc = hjson_get_num(o, "max_frequency", false, &p->max_frequency, path, err);
  if (!rc) rc = hjson_get_num(o, "preemphasis", false, &p->preemphasis, path, err);
  if (!rc) rc = hjson_get_bool(o, "preemphasis_htk_flavor", false, &p->preemphasis_htk_flavor, path, err);
  if (!rc) rc = hjson_get_bool(o, "fft_overdrive", false, &p->fft_overdrive, path, err);
  if (!rc) rc = hjson_get_num(o, "input_scale_factor", false, &p->input_scale_factor, path, err);
  const json_t *mf = json_object_get(o, "mel_floor");
  if (!rc && mf && json_is_array(mf) && json_array_size(mf) == 1) mf = json_array_get(mf, 0);
  if (!rc && mf && !json_is_null(mf)) {
    if (json_is_number(mf)) p->mel_floor = json_number_value(mf);
    else rc = herr_set(err, HEARTH_EFORMAT, "%s: 'mel_floor' must be a number", path);
  }
  double dither = 0;
  if (!rc) rc = hjson_get_num(o, "dither", false, &dither, path, err);
  if (!rc && (p->feature_size <= 0 || p->feature_size > GEMMA4_MEL_MAX || p->sampling_rate <= 0 ||
              !(p->frame_length_ms > 0) || !(p->hop_length_ms > 0) || !(p->mel_floor > 0) ||
              !(p->max_frequency > p->min_frequency) || !isfinite(p->input_scale_factor)))
    rc = herr_set(err, HEARTH_EFORMAT, "%s: feature sizes or frequencies out of range", path);
  if (!rc && dither != 0)
    rc = herr_set(err, HEARTH_EUNSUPPORTED, "%s: dither %g adds random noise to the features (only 0 is supported)", path, dither);
  if (!rc) rc = read_bins(o, "per_bin_mean", p->feature_size, p->per_bin_mean, &p->has_mean, path, err);
  if (!rc) rc = read_bins(o, "per_bin_stddev", p->feature_size, p->per_bin_stddev, &p->has_std, path, err);
  json_decref(o);
  return rc;
}

static int frame_len(const gemma4_audio_prep *p) { return (int)nearbyint(p->sampling_rate * p->frame_length_ms / 1000.0); }
static int hop_len(const gemma4_audio_prep *p) { return (int)nearbyint(p->sampling_rate * p->hop_length_ms / 1000.0); }

static int64_t padded_len(const gemma4_audio_prep *p, int64_t n) {
  if (p->max_length > 0 && n > p->max_length) n = p->max_length;
  int64_t m = p->pad_to_multiple_of > 0 ? p->pad_to_multiple_of : 1;
  return (n + m - 1) / m * m;
}

/* In-place radix-2 FFT of n (a power of 2) complex values. */
static void fft(double *re, double *im, int n) {
  for (int i = 1, j = 0; i < n; i++) {
    int bit = n >> 1;
    for (; j & bit; bit >>= 1) j ^= bit;
    j ^= bit;
    if (i < j) {
      double t = re[i];
      re[i] = re[j], re[j] = t;
      t = im[i];
      im[i] = im[j], im[j] = t;
    }
  }
  for (int len = 2; len <= n; len <<= 1) {
    double ang = -2.0 * M_PI / len;
    for (int i = 0; i < n; i += len)
      for (int k = 0; k < len / 2; k++) {
        double c = cos(ang * k), s = sin(ang * k);
        double ur = re[i + k], ui = im[i + k];
        double vr = re[i + k + len / 2] * c - im[i + k + len / 2] * s;
        double vi = re[i + k + len / 2] * s + im[i + k + len / 2] * c;
        re[i + k] = ur + vr, im[i + k] = ui + vi;
        re[i + k + len / 2] = ur - vr, im[i + k + len / 2] = ui - vi;
      }
  }
}

/* numpy.linspace(a, b, n)[i] */
static double linspace_at(double a, double b, int n, int i) {
  if (i == n - 1) return b;
  double step = (b - a) / (double)(n - 1);
  return (double)i * step + a;
}

int gemma4_audio_features(const gemma4_audio_prep *p, const float *pcm, int64_t n, float **feat, uint8_t **mask,
                          int64_t *frames, herr *err) {
  *feat = NULL, *mask = NULL, *frames = 0;
  const int FL = frame_len(p), HOP = hop_len(p), NM = p->feature_size;
  if (FL <= 1 || HOP <= 0) return herr_set(err, HEARTH_EINVAL, "audio features: frame %d, hop %d samples", FL, HOP);
  int NFFT = 1;
  while (NFFT < FL) NFFT <<= 1;
  if (p->fft_overdrive) NFFT <<= 1;
  const int NB = NFFT / 2 + 1, pad_left = FL / 2, fsz = FL + 1;
  int64_t real = p->max_length > 0 && n > p->max_length ? p->max_length : n, L = padded_len(p, n), total = L + pad_left;
  int64_t nf = total >= fsz ? (total - fsz) / HOP + 1 : 0;
  float *wav = calloc((size_t)total + 1, sizeof(float)), *win = malloc(sizeof(float) * (size_t)FL);
  double *filt = malloc(sizeof(double) * (size_t)NB * (size_t)NM), *re = malloc(sizeof(double) * (size_t)NFFT);
  double *im = malloc(sizeof(double) * (size_t)NFFT), *mag = malloc(sizeof(double) * (size_t)NB);
  float *f = malloc(sizeof(float) * (size_t)(nf > 0 ? nf : 1) * (size_t)NM);
  uint8_t *mk = malloc((size_t)(nf > 0 ? nf : 1));
  int rc = 0;
  if (!wav || !win || !filt || !re || !im || !mag || !f || !mk) {
    rc = herr_set(err, HEARTH_ENOMEM, "audio features: out of memory");
    goto done;
  }
  /* the clip, scaled in f32, after pad_left zeros; padding after it */
  for (int64_t i = 0; i < real; i++)
    wav[pad_left + i] = p->input_scale_factor != 1.0 ? pcm[i] * (float)p->input_scale_factor : pcm[i];
  /* periodic Hann window: numpy.hanning(FL + 1)[:-1] */
  for (int k = 0; k < FL; k++) {
    double nn = (double)(1 - (FL + 1) + 2 * k);
    win[k] = (float)(0.5 + 0.5 * cos(M_PI * nn / (double)FL));
  }
  /* HTK mel filters without normalization (transformers' mel_filter_bank) */
  double mel_lo = 2595.0 * log10(1.0 + p->min_frequency / 700.0), mel_hi = 2595.0 * log10(1.0 + p->max_frequency / 700.0);
  double ff[GEMMA4_MEL_MAX + 2];
  for (int j = 0; j < NM + 2; j++) ff[j] = 700.0 * (pow(10.0, linspace_at(mel_lo, mel_hi, NM + 2, j) / 2595.0) - 1.0);
  for (int b = 0; b < NB; b++) {
    double fb = linspace_at(0.0, (double)(p->sampling_rate / 2), NB, b);
    for (int j = 0; j < NM; j++) {
      double down = -(ff[j] - fb) / (ff[j + 1] - ff[j]), up = (ff[j + 2] - fb) / (ff[j + 2] - ff[j + 1]);
      double v = down < up ? down : up;
      filt[(size_t)b * NM + j] = v > 0.0 ? v : 0.0;
    }
  }
  const float pe = (float)p->preemphasis, pe1 = (float)(1.0 - p->preemphasis);
  for (int64_t t = 0; t < nf; t++) {
    const float *s = wav + t * HOP;
    for (int k = 0; k < NFFT; k++) re[k] = im[k] = 0.0;
    for (int k = 0; k < FL; k++) {
      float x;
      if (p->preemphasis > 0) {
        if (p->preemphasis_htk_flavor) x = k == 0 ? s[0] * pe1 : s[k] - pe * s[k - 1];
        else x = s[k + 1] - pe * s[k];
      } else
        x = s[k];
      re[k] = (double)(x * win[k]);
    }
    fft(re, im, NFFT);
    for (int b = 0; b < NB; b++) mag[b] = (double)(float)sqrt(re[b] * re[b] + im[b] * im[b]); /* numpy: complex64 -> f32 */
    int64_t end = t * HOP + fsz - 1; /* the last sample of the window, in left-padded coordinates */
    mk[t] = end >= pad_left && end < pad_left + real;
    for (int j = 0; j < NM; j++) {
      double acc = 0.0;
      for (int b = 0; b < NB; b++) acc += mag[b] * filt[(size_t)b * NM + j];
      double v = log(acc + p->mel_floor);
      if (p->has_mean) v -= p->per_bin_mean[j];
      if (p->has_std) v /= p->per_bin_stddev[j];
      f[t * NM + j] = mk[t] ? (float)v : 0.0f;
    }
  }
  *feat = f, *mask = mk, *frames = nf;
  f = NULL, mk = NULL;
done:
  free(wav), free(win), free(filt), free(re), free(im), free(mag), free(f), free(mk);
  return rc;
}

int64_t gemma4_audio_num_tokens(const gemma4_audio_prep *p, int64_t n) {
  const int FL = frame_len(p), HOP = hop_len(p), pad_left = FL / 2, fsz = FL + 1;
  int64_t real = p->max_length > 0 && n > p->max_length ? p->max_length : n, total = padded_len(p, n) + pad_left;
  if (HOP <= 0 || total < fsz) return 0;
  int64_t nf = (total - fsz) / HOP + 1, count = 0;
  /* frame t is valid when its last sample is real; the tower keeps every second frame, twice */
  for (int64_t t = 0; t < nf; t += 4) {
    int64_t end = t * HOP + fsz - 1;
    count += end >= pad_left && end < pad_left + real;
  }
  return count;
}
