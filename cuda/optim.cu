// Fused optimizer steps on CUDA (core/detail/optim_kernels.h): SGD (momentum, dampening, Nesterov,
// weight decay) and Adam/AdamW (bias correction, AMSGrad) as multi-tensor kernels. One launch
// covers up to kMaxTensors parameters, their pointers passed by value in the kernel arguments:
// blockIdx.y picks the parameter, a grid-stride loop over blockIdx.x covers its elements, and each
// element's param, grad and state are read once and written once. The arithmetic follows
// nn/optim.cpp's CPU loops (torch.optim's order of operations) in f32 for f32/f16/bf16 and f64
// for f64; f16/bf16 parameters and state are rounded once per step.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/detail/kernel_tables.h"
#include "core/detail/optim_kernels.h"
#include "core/tensor.h"
#include "cuda/detail/check.h"
#include "cuda/detail/launch.h"
#include "cuda/runtime.h"

namespace tandem::cuda {

namespace {

using detail::AdamStepOptions;
using detail::AdamStepTensors;
using detail::SgdStepOptions;
using detail::SgdStepTensors;

// Kernel arguments stay under the classic 4 KiB limit at this count.
constexpr int kMaxTensors = 48;
// Blocks per parameter at most; the grid-stride loop covers larger ones.
constexpr int64_t kMaxBlocksPerTensor = 1024;

template <class T> struct Math { using type = float; };
template <> struct Math<double> { using type = double; };

__device__ inline float device_sqrt(float x) { return sqrtf(x); }
__device__ inline double device_sqrt(double x) { return sqrt(x); }

struct SgdBatch {
  int count = 0;
  void* param[kMaxTensors];
  const void* grad[kMaxTensors];
  void* buf[kMaxTensors];
  int64_t numel[kMaxTensors];
  bool first[kMaxTensors];
};

struct SgdScalars {
  double sign, neg_lr, wd, mom, damp1;
  bool decay, momentum, nesterov;
};

template <class T>
__global__ void sgd_kernel(SgdBatch batch, SgdScalars s) {
  using A = typename Math<T>::type;
  const int t = blockIdx.y;
  T* __restrict__ p = static_cast<T*>(batch.param[t]);
  const T* __restrict__ g = static_cast<const T*>(batch.grad[t]);
  T* __restrict__ buf = static_cast<T*>(batch.buf[t]);
  const int64_t n = batch.numel[t];
  const bool first = batch.first[t];
  const A sign = A(s.sign), neg_lr = A(s.neg_lr), wd = A(s.wd), mom = A(s.mom), damp1 = A(s.damp1);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const A pi = A(p[i]);
    A d = A(g[i]) * sign;
    if (s.decay) d = d + wd * pi;
    if (s.momentum) {
      const A b = first ? d : A(buf[i]) * mom + damp1 * d;
      buf[i] = T(b);
      d = s.nesterov ? d + mom * b : b;
    }
    p[i] = T(pi + neg_lr * d);
  }
}

struct AdamBatch {
  int count = 0;
  void* param[kMaxTensors];
  const void* grad[kMaxTensors];
  void* exp_avg[kMaxTensors];
  void* exp_avg_sq[kMaxTensors];
  void* max_exp_avg_sq[kMaxTensors];
  int64_t numel[kMaxTensors];
  double neg_step_size[kMaxTensors];
  double bc2_sqrt[kMaxTensors];
};

struct AdamScalars {
  double sign, decay_factor, l2, beta1, one_minus_beta1, beta2, one_minus_beta2, eps;
  bool decoupled, amsgrad;
};

template <class T>
__global__ void adam_kernel(AdamBatch batch, AdamScalars s) {
  using A = typename Math<T>::type;
  const int t = blockIdx.y;
  T* __restrict__ p = static_cast<T*>(batch.param[t]);
  const T* __restrict__ g = static_cast<const T*>(batch.grad[t]);
  T* __restrict__ m = static_cast<T*>(batch.exp_avg[t]);
  T* __restrict__ v = static_cast<T*>(batch.exp_avg_sq[t]);
  T* __restrict__ vmax = static_cast<T*>(batch.max_exp_avg_sq[t]);
  const int64_t n = batch.numel[t];
  const A sign = A(s.sign), decay_factor = A(s.decay_factor), l2 = A(s.l2), beta1 = A(s.beta1),
          one_minus_beta1 = A(s.one_minus_beta1), beta2 = A(s.beta2), one_minus_beta2 = A(s.one_minus_beta2),
          eps = A(s.eps), neg_step_size = A(batch.neg_step_size[t]), bc2_sqrt = A(batch.bc2_sqrt[t]);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    A pi = A(p[i]);
    A gi = A(g[i]) * sign;
    if (s.decoupled) {
      pi = pi * decay_factor;
    } else {
      gi = gi + l2 * pi;
    }
    const A mi = A(m[i]) * beta1 + one_minus_beta1 * gi;
    const A vi = A(v[i]) * beta2 + one_minus_beta2 * gi * gi;
    m[i] = T(mi);
    v[i] = T(vi);
    A vv = vi;
    if (s.amsgrad) {
      const A prev = A(vmax[i]);
      vv = prev < vi ? vi : prev;
      vmax[i] = T(vv);
    }
    const A denom = device_sqrt(vv) / bc2_sqrt + eps;
    p[i] = T(pi + neg_step_size * mi / denom);
  }
}

dim3 grid_for(int64_t max_numel, int count) {
  const int64_t bx = std::min<int64_t>(blocks_for(max_numel, 4), kMaxBlocksPerTensor);
  return dim3(static_cast<unsigned>(bx), static_cast<unsigned>(count));
}

// Dtype-dispatched launch of one batch.
template <template <class> class Launch, class... Args>
void launch_typed(Dtype dtype, const char* op, Args&&... args) {
  switch (dtype) {
    case f32: return Launch<float>::run(args...);
    case f64: return Launch<double>::run(args...);
    case f16: return Launch<Half>::run(args...);
    case bf16: return Launch<BFloat16>::run(args...);
    default: fail("[{}] fused step needs floating parameters, got {}", op, dtype);
  }
}

template <class T>
struct LaunchSgd {
  static void run(const SgdBatch& b, const SgdScalars& s, int64_t max_numel, cudaStream_t stream) {
    sgd_kernel<T><<<grid_for(max_numel, b.count), kBlockThreads, 0, stream>>>(b, s);
    TANDEM_CUDA_CHECK_LAUNCH("sgd_kernel");
  }
};

template <class T>
struct LaunchAdam {
  static void run(const AdamBatch& b, const AdamScalars& s, int64_t max_numel, cudaStream_t stream) {
    adam_kernel<T><<<grid_for(max_numel, b.count), kBlockThreads, 0, stream>>>(b, s);
    TANDEM_CUDA_CHECK_LAUNCH("adam_kernel");
  }
};

void check_tensor(const Tensor& t, const Tensor& param, const char* what, const char* op) {
  TANDEM_CHECK(t.device() == param.device() && t.dtype() == param.dtype() && t.is_contiguous() &&
                   t.numel() == param.numel(),
               "[{}] internal: fused step got a {} on {} ({}, shape {}) for a parameter on {} ({}, shape {})", op, what,
               t.device(), t.dtype(), t.shape(), param.device(), param.dtype(), param.shape());
}

class CudaOptimKernels final : public detail::OptimDeviceKernels {
 public:
  void sgd_step(const std::vector<SgdStepTensors>& tensors, const SgdStepOptions& o) override {
    const char* op = "SGD";
    if (tensors.empty()) return;
    const Tensor& p0 = tensors[0].param;
    const bool momentum = o.momentum != 0;
    SgdScalars s{o.maximize ? -1.0 : 1.0, -o.lr, o.weight_decay, o.momentum, 1 - o.dampening,
                 o.weight_decay != 0, momentum, o.nesterov};
    DeviceGuard guard(p0.device());
    cudaStream_t stream = current_stream(p0.device());
    SgdBatch batch;
    int64_t max_numel = 0;
    auto flush = [&] {
      if (batch.count > 0) launch_typed<LaunchSgd>(p0.dtype(), op, batch, s, max_numel, stream);
      batch.count = 0;
      max_numel = 0;
    };
    for (const SgdStepTensors& t : tensors) {
      check_tensor(t.param, p0, "parameter", op);
      check_tensor(t.grad, t.param, "gradient", op);
      if (momentum) check_tensor(t.momentum_buffer, t.param, "momentum buffer", op);
      if (t.param.numel() == 0) continue;
      const int i = batch.count++;
      batch.param[i] = t.param.data_ptr();
      batch.grad[i] = t.grad.data_ptr();
      batch.buf[i] = momentum ? t.momentum_buffer.data_ptr() : nullptr;
      batch.numel[i] = t.param.numel();
      batch.first[i] = t.first;
      max_numel = std::max(max_numel, t.param.numel());
      if (batch.count == kMaxTensors) flush();
    }
    flush();
  }

  void adam_step(const std::vector<AdamStepTensors>& tensors, const AdamStepOptions& o) override {
    const char* op = o.decoupled ? "AdamW" : "Adam";
    if (tensors.empty()) return;
    const Tensor& p0 = tensors[0].param;
    AdamScalars s{o.maximize ? -1.0 : 1.0, 1 - o.lr * o.weight_decay, o.weight_decay, o.beta1, 1 - o.beta1, o.beta2,
                  1 - o.beta2, o.eps, o.decoupled, o.amsgrad};
    DeviceGuard guard(p0.device());
    cudaStream_t stream = current_stream(p0.device());
    AdamBatch batch;
    int64_t max_numel = 0;
    auto flush = [&] {
      if (batch.count > 0) launch_typed<LaunchAdam>(p0.dtype(), op, batch, s, max_numel, stream);
      batch.count = 0;
      max_numel = 0;
    };
    for (const AdamStepTensors& t : tensors) {
      check_tensor(t.param, p0, "parameter", op);
      check_tensor(t.grad, t.param, "gradient", op);
      check_tensor(t.exp_avg, t.param, "exp_avg", op);
      check_tensor(t.exp_avg_sq, t.param, "exp_avg_sq", op);
      if (o.amsgrad) check_tensor(t.max_exp_avg_sq, t.param, "max_exp_avg_sq", op);
      if (t.param.numel() == 0) continue;
      const int i = batch.count++;
      batch.param[i] = t.param.data_ptr();
      batch.grad[i] = t.grad.data_ptr();
      batch.exp_avg[i] = t.exp_avg.data_ptr();
      batch.exp_avg_sq[i] = t.exp_avg_sq.data_ptr();
      batch.max_exp_avg_sq[i] = o.amsgrad ? t.max_exp_avg_sq.data_ptr() : nullptr;
      batch.numel[i] = t.param.numel();
      batch.neg_step_size[i] = -t.step_size;
      batch.bc2_sqrt[i] = t.bias_correction2_sqrt;
      max_numel = std::max(max_numel, t.param.numel());
      if (batch.count == kMaxTensors) flush();
    }
    flush();
  }
};

static_assert(sizeof(AdamBatch) + sizeof(AdamScalars) < 4000, "kernel arguments over 4 KiB");
static_assert(sizeof(SgdBatch) + sizeof(SgdScalars) < 4000, "kernel arguments over 4 KiB");

}  // namespace

void install_optim_kernels() {
  static CudaOptimKernels kernels;
  register_device_kernels<detail::OptimDeviceKernels>(DeviceType::cuda, &kernels);
}

}  // namespace tandem::cuda
