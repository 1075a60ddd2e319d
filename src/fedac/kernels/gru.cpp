// The recurrence of one GRU direction for K stacked clients (models/stacked.py `_GRULayer`), forward
// and backward over all timesteps in one call. Per step: one batched matmul (ATen) and one fused pass
// over the gates, instead of ~10 torch ops dispatched from Python per step. The gate math is the one
// models/stacked.py's pure-torch loop does (torch's CPU GRU), with the same vectorized sigmoid / tanh
// (ATen's Vectorized<float>, Sleef) as torch's own kernels: 8 lanes in the AVX2 build, 16 in the AVX-512
// one (CPU_CAPABILITY_* and -m flags from fedac/kernels/__init__.py, which builds it).
#include <torch/extension.h>
#include <ATen/cpu/vec/vec.h>

#include <vector>

namespace {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t kLanes = Vec::size();

// torch's CPU sigmoid kernel: 1 / (1 + exp(0 - x))
inline Vec sigmoid(Vec x) { return (Vec(1.0f) + (Vec(0.0f) - x).exp()).reciprocal(); }

inline Vec load(const float* p, int64_t n) { return n == kLanes ? Vec::loadu(p) : Vec::loadu(p, n); }
inline void store(const Vec& v, float* p, int64_t n) { n == kLanes ? v.store(p) : v.store(p, n); }

void check(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous() && t.device().is_cpu(),
              name, " must be a contiguous float32 CPU tensor");
}

// gi (K, T, B, 3H): input gates with b_ih; w_t (K, H, 3H) = W_hh^T; b_hh (K, 3H).
// Returns out (K, T, B, H) hidden states, gates (T, K, B, 3H) = (r, z, W_hh h + b_hh's n part), news (K, T, B, H).
std::vector<at::Tensor> forward(const at::Tensor& gi, const at::Tensor& w_t, const at::Tensor& b_hh, bool reverse) {
  check(gi, "gi"); check(w_t, "w_t"); check(b_hh, "b_hh");
  const int64_t K = gi.size(0), T = gi.size(1), B = gi.size(2), H = w_t.size(1), H3 = 3 * H;
  auto out = at::empty({K, T, B, H}, gi.options());
  auto gates = at::empty({T, K, B, H3}, gi.options());
  auto news = at::empty({K, T, B, H}, gi.options());
  auto bias = b_hh.unsqueeze(1);
  at::Tensor h = at::zeros({K, B, H}, gi.options());
  const float* gi_p = gi.data_ptr<float>();
  float* out_p = out.data_ptr<float>();
  float* news_p = news.data_ptr<float>();
  for (int64_t i = 0; i < T; ++i) {
    const int64_t t = reverse ? T - 1 - i : i;
    at::Tensor g = gates.select(0, t);
    at::baddbmm_out(g, bias, h, w_t);
    float* g_p = g.data_ptr<float>();
    const float* h_p = h.data_ptr<float>();
    const int64_t h_batch = h.stride(0);  // the zero state is (B, H) per client, later ones are out's slices
    for (int64_t k = 0; k < K; ++k) {
      for (int64_t b = 0; b < B; ++b) {
        float* gr = g_p + (k * B + b) * H3;
        const float* ir = gi_p + ((k * T + t) * B + b) * H3;
        const float* hr = h_p + k * h_batch + b * H;
        float* nr = news_p + ((k * T + t) * B + b) * H;
        float* orow = out_p + ((k * T + t) * B + b) * H;
        for (int64_t j = 0; j < H; j += kLanes) {
          const int64_t n_l = std::min(kLanes, H - j);
          Vec r = sigmoid(load(gr + j, n_l) + load(ir + j, n_l));
          Vec z = sigmoid(load(gr + H + j, n_l) + load(ir + H + j, n_l));
          Vec n = (load(gr + 2 * H + j, n_l) * r + load(ir + 2 * H + j, n_l)).tanh();
          store(r, gr + j, n_l);
          store(z, gr + H + j, n_l);
          store(n, nr + j, n_l);
          store((load(hr + j, n_l) - n) * z + n, orow + j, n_l);
        }
      }
    }
    h = out.select(1, t);
  }
  return {out, gates, news};
}

// Backpropagation through the recurrence. grad_out, out, news (K, T, B, H); gates (T, K, B, 3H) from
// forward; w_hh (K, 3H, H). Returns grad_gates (K, T, B, 3H), the gradient of W_hh h + b_hh (r, z, n
// parts), and grad_n (K, T, B, H), the gradient of the input gate of n (r's and z's are grad_gates').
std::vector<at::Tensor> backward(const at::Tensor& grad_out_in, const at::Tensor& out, const at::Tensor& gates,
                                 const at::Tensor& news, const at::Tensor& w_hh, bool reverse) {
  const at::Tensor grad_out = grad_out_in.contiguous();
  check(out, "out"); check(gates, "gates"); check(news, "news"); check(w_hh, "w_hh");
  const int64_t K = out.size(0), T = out.size(1), B = out.size(2), H = out.size(3), H3 = 3 * H;
  auto grad_gates = at::empty({K, T, B, H3}, out.options());
  auto grad_n = at::empty({K, T, B, H}, out.options());
  auto dg_step = at::empty({K, B, H3}, out.options());  // contiguous copy of this step's grad_gates for the matmul
  auto dh = at::zeros({K, B, H}, out.options());  // gradient reaching h from later steps
  const float *go_p = grad_out.data_ptr<float>(), *out_p = out.data_ptr<float>();
  const float *gates_p = gates.data_ptr<float>(), *news_p = news.data_ptr<float>();
  float *gg_p = grad_gates.data_ptr<float>(), *gn_p = grad_n.data_ptr<float>();
  float *dgs_p = dg_step.data_ptr<float>(), *dh_p = dh.data_ptr<float>();
  const Vec one(1.0f);
  for (int64_t i = 0; i < T; ++i) {
    const int64_t t = reverse ? i : T - 1 - i;
    const int64_t prev = reverse ? t + 1 : t - 1;
    const bool has_prev = prev >= 0 && prev < T;
    for (int64_t k = 0; k < K; ++k) {
      for (int64_t b = 0; b < B; ++b) {
        const int64_t row = (k * T + t) * B + b;
        const float* g = gates_p + ((t * K + k) * B + b) * H3;
        const float* n_r = news_p + row * H;
        const float* go = go_p + row * H;
        const float* hp = has_prev ? out_p + ((k * T + prev) * B + b) * H : nullptr;
        float* dhr = dh_p + (k * B + b) * H;
        float* dg = dgs_p + (k * B + b) * H3;
        float* gg = gg_p + row * H3;
        float* gn = gn_p + row * H;
        for (int64_t j = 0; j < H; j += kLanes) {
          const int64_t n_l = std::min(kLanes, H - j);
          Vec dhv = load(dhr + j, n_l) + load(go + j, n_l);
          Vec r = load(g + j, n_l), z = load(g + H + j, n_l), g_n = load(g + 2 * H + j, n_l);
          Vec n = load(n_r + j, n_l);
          Vec h_prev = hp ? load(hp + j, n_l) : Vec(0.0f);
          // h' = (h - n) z + n;  n = tanh(i_n + r g_n);  r, z = sigmoid(.)  (torch's *_backward formulas)
          Vec da_n = (dhv * (one - z)) * (one - n * n);
          Vec d_gn = da_n * r;
          Vec d_r = ((da_n * g_n) * (one - r)) * r;
          Vec d_z = ((dhv * (h_prev - n)) * (one - z)) * z;
          store(d_r, dg + j, n_l); store(d_z, dg + H + j, n_l); store(d_gn, dg + 2 * H + j, n_l);
          store(d_r, gg + j, n_l); store(d_z, gg + H + j, n_l); store(d_gn, gg + 2 * H + j, n_l);
          store(da_n, gn + j, n_l);
          store(dhv * z, dhr + j, n_l);  // the direct path h -> h'; the matmul below adds the gates' paths
        }
      }
    }
    dh.baddbmm_(dg_step, w_hh);
  }
  return {grad_gates, grad_n};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // Released GIL: cohort worker threads run chunks in parallel (engine/execution.py `run_chunks`).
  m.def("forward", &forward, py::call_guard<py::gil_scoped_release>());
  m.def("backward", &backward, py::call_guard<py::gil_scoped_release>());
  m.def("lanes", [] { return kLanes; });  // floats per vector: 8 in the AVX2 build, 16 in the AVX-512 one
}
