// Hash-grid encoding for the CPU: forward and backward in one pass each, no temporaries.
//
// Same indexing as hvd_ngp/model/encoding/hashgrid.py (tiny-cuda-nn conventions); that file is the
// reference this kernel is tested against. Forward is parallel over points; backward is parallel
// over levels, whose table slices are disjoint, so it needs no atomics.
#include <torch/extension.h>

#include <ATen/Parallel.h>
#include <cmath>
#include <cstdint>
#include <vector>

namespace {

constexpr uint32_t kPrimes[3] = {1u, 2654435761u, 805459861u};

struct Level {
  float scale;
  uint32_t resolution;
  uint32_t size;
  uint32_t offset;
  bool hashed;
};

// Table rows and trilinear weights of the 8 corners of point p at level lv (corner c: bit d = offset
// along dim d). Positions are >= 0.5 (inputs are in [0, 1]), so truncation is floor.
inline void corners(const Level& lv, const float* p, uint32_t idx[8], float w[8]) {
  uint32_t b[3];
  float fr[3];
  for (int d = 0; d < 3; ++d) {
    const float pos = p[d] * lv.scale + 0.5f;
    const int32_t c = static_cast<int32_t>(pos);
    b[d] = static_cast<uint32_t>(c);
    fr[d] = pos - static_cast<float>(c);
  }
  if (lv.hashed) {  // hashed levels hold 2^k rows: the modulo is a mask
    const uint32_t mask = lv.size - 1;
    const uint32_t hx[2] = {b[0] * kPrimes[0], (b[0] + 1) * kPrimes[0]};
    const uint32_t hy[2] = {b[1] * kPrimes[1], (b[1] + 1) * kPrimes[1]};
    const uint32_t hz[2] = {b[2] * kPrimes[2], (b[2] + 1) * kPrimes[2]};
    for (int c = 0; c < 8; ++c) idx[c] = lv.offset + ((hx[c & 1] ^ hy[(c >> 1) & 1] ^ hz[c >> 2]) & mask);
  } else {  // dense: only the far faces run past the table and wrap
    const uint32_t r = lv.resolution, r2 = r * r;
    const uint32_t base = b[0] + b[1] * r + b[2] * r2;
    for (int c = 0; c < 8; ++c) {
      const uint32_t v = base + (c & 1) + ((c >> 1) & 1) * r + (c >> 2) * r2;
      idx[c] = lv.offset + (v < lv.size ? v : v % lv.size);
    }
  }
  const float wx[2] = {1.0f - fr[0], fr[0]}, wy[2] = {1.0f - fr[1], fr[1]}, wz[2] = {1.0f - fr[2], fr[2]};
  for (int c = 0; c < 8; ++c) w[c] = wx[c & 1] * wy[(c >> 1) & 1] * wz[c >> 2];
}

// One level, points [begin, end): out[i, l, :] = sum_c w_c * table[idx_c, :]
template <int F>
void level_forward(const Level& lv, const float* x, const float* table, float* out, int64_t begin, int64_t end,
                   int64_t L, int64_t l, int64_t nf) {
  const int64_t n_feat = F > 0 ? F : nf;
  uint32_t idx[8];
  float w[8];
  float acc[F > 0 ? F : 16];
  for (int64_t i = begin; i < end; ++i) {
    corners(lv, x + i * 3, idx, w);
    for (int64_t f = 0; f < n_feat; ++f) acc[f] = 0.0f;
    for (int c = 0; c < 8; ++c) {
      const float* src = table + static_cast<int64_t>(idx[c]) * n_feat;
      for (int64_t f = 0; f < n_feat; ++f) acc[f] += w[c] * src[f];
    }
    float* dst = out + (i * L + l) * n_feat;
    for (int64_t f = 0; f < n_feat; ++f) dst[f] = acc[f];
  }
}

// One level, all points: grad_table[idx_c, :] += w_c * grad_out[i, l, :]
template <int F>
void level_backward(const Level& lv, const float* x, const float* grad_out, float* grad_table, int64_t N, int64_t L,
                    int64_t l, int64_t nf) {
  const int64_t n_feat = F > 0 ? F : nf;
  uint32_t idx[8];
  float w[8];
  for (int64_t i = 0; i < N; ++i) {
    corners(lv, x + i * 3, idx, w);
    const float* g = grad_out + (i * L + l) * n_feat;
    for (int c = 0; c < 8; ++c) {
      float* dst = grad_table + static_cast<int64_t>(idx[c]) * n_feat;
      for (int64_t f = 0; f < n_feat; ++f) dst[f] += w[c] * g[f];
    }
  }
}

std::vector<Level> levels_from(const torch::Tensor& scales, const torch::Tensor& resolutions,
                               const torch::Tensor& sizes, const torch::Tensor& offsets,
                               const torch::Tensor& hashed) {
  const int64_t L = scales.size(0);
  auto s = scales.contiguous().to(torch::kFloat32);
  auto r = resolutions.contiguous().to(torch::kInt64);
  auto z = sizes.contiguous().to(torch::kInt64);
  auto o = offsets.contiguous().to(torch::kInt64);
  auto h = hashed.contiguous().to(torch::kBool);
  std::vector<Level> out(L);
  for (int64_t l = 0; l < L; ++l) {
    out[l] = Level{s.data_ptr<float>()[l], static_cast<uint32_t>(r.data_ptr<int64_t>()[l]),
                   static_cast<uint32_t>(z.data_ptr<int64_t>()[l]), static_cast<uint32_t>(o.data_ptr<int64_t>()[l]),
                   h.data_ptr<bool>()[l]};
  }
  return out;
}

void check_inputs(const torch::Tensor& x, const torch::Tensor& params) {
  TORCH_CHECK(x.device().is_cpu() && params.device().is_cpu(), "hashgrid_cpu: tensors must be on the CPU");
  TORCH_CHECK(x.dim() == 2 && x.size(1) == 3, "hashgrid_cpu: x must be [N, 3]");
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && params.scalar_type() == torch::kFloat32,
              "hashgrid_cpu: x and params must be float32");
  TORCH_CHECK(params.dim() == 2, "hashgrid_cpu: params must be [T, F]");
}

}  // namespace

// x [N, 3] in [0, 1], params [T, F] -> features [N, L * F]
torch::Tensor hashgrid_forward(torch::Tensor x, torch::Tensor params, torch::Tensor scales, torch::Tensor resolutions,
                               torch::Tensor sizes, torch::Tensor offsets, torch::Tensor hashed) {
  check_inputs(x, params);
  x = x.contiguous();
  params = params.contiguous();
  const auto levels = levels_from(scales, resolutions, sizes, offsets, hashed);
  const int64_t N = x.size(0), L = static_cast<int64_t>(levels.size()), F = params.size(1);
  auto out = torch::zeros({N, L * F}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* tp = params.data_ptr<float>();
  float* op = out.data_ptr<float>();
  TORCH_CHECK(F <= 16, "hashgrid_cpu: at most 16 features per level");
  // Level-outer inside each chunk of points: one level's table slice stays in cache.
  at::parallel_for(0, N, 2048, [&](int64_t begin, int64_t end) {
    for (int64_t l = 0; l < L; ++l) {
      if (F == 2) level_forward<2>(levels[l], xp, tp, op, begin, end, L, l, F);
      else if (F == 4) level_forward<4>(levels[l], xp, tp, op, begin, end, L, l, F);
      else level_forward<0>(levels[l], xp, tp, op, begin, end, L, l, F);
    }
  });
  return out;
}

// grad_out [N, L * F] -> grad_params [T, F]
torch::Tensor hashgrid_backward(torch::Tensor grad_out, torch::Tensor x, int64_t n_rows, int64_t n_features,
                                torch::Tensor scales, torch::Tensor resolutions, torch::Tensor sizes,
                                torch::Tensor offsets, torch::Tensor hashed) {
  x = x.contiguous();
  grad_out = grad_out.contiguous().to(torch::kFloat32);
  const auto levels = levels_from(scales, resolutions, sizes, offsets, hashed);
  const int64_t N = x.size(0), L = static_cast<int64_t>(levels.size()), F = n_features;
  TORCH_CHECK(grad_out.size(0) == N && grad_out.size(1) == L * F, "hashgrid_cpu: grad_out must be [N, L*F]");
  auto grad = torch::zeros({n_rows, F}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* gp = grad_out.data_ptr<float>();
  float* dp = grad.data_ptr<float>();
  // Parallel over levels: their table slices are disjoint, so no atomics are needed.
  at::parallel_for(0, L, 1, [&](int64_t lbegin, int64_t lend) {
    for (int64_t l = lbegin; l < lend; ++l) {
      if (F == 2) level_backward<2>(levels[l], xp, gp, dp, N, L, l, F);
      else if (F == 4) level_backward<4>(levels[l], xp, gp, dp, N, L, l, F);
      else level_backward<0>(levels[l], xp, gp, dp, N, L, l, F);
    }
  });
  return grad;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &hashgrid_forward, "hash-grid encoding forward (CPU)");
  m.def("backward", &hashgrid_backward, "hash-grid encoding backward w.r.t. the table (CPU)");
}
