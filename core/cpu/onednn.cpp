// bf16 GEMM and f32 convolution through oneDNN (see core/cpu/onednn.h).
#include "core/cpu/onednn.h"

#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "core/detail/matmul.h"
#include "core/error.h"
#include "core/parallel.h"

#if TANDEM_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>
#include <memory>
#include <mutex>
#include <unordered_map>

// GNU OpenMP's team size, which oneDNN's parallel regions use (declared here: omp.h is the
// compiler's, and clang's differs).
extern "C" int omp_get_max_threads();
extern "C" void omp_set_num_threads(int);
#endif

namespace tandem::detail {

#if TANDEM_HAVE_ONEDNN

namespace {

bool onednn_switched_off() {
  const char* env = std::getenv("TANDEM_ONEDNN");
  return env && std::strcmp(env, "0") == 0;
}

bool cpu_has_bf16_gemm() {
  if (onednn_switched_off()) return false;
  try {
    // The ISA values are nested bit sets: a CPU has an ISA when it has all of its bits. Without
    // AVX512_BF16 oneDNN would emulate bf16 and lose to the f32 sgemm route.
    const auto want = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
    return (static_cast<unsigned>(dnnl::get_effective_cpu_isa()) & want) == want;
  } catch (const dnnl::error&) {
    return false;
  }
}

// One primitive per problem shape, per thread (a primitive descriptor costs tens of microseconds
// to create: more than a small GEMM). Bounded: a program with ever-new shapes starts over.
// `threads`: oneDNN fixes a primitive's thread count when it creates it (from the calling
// thread's OpenMP team size), so a primitive serves one intra-op thread count.
struct GemmKey {
  int64_t M, N, K, as0, as1, bs0, bs1, ldc, threads;
  bool accumulate;
  dnnl::memory::data_type type;  // bf16 or f32, every operand
  bool operator==(const GemmKey&) const = default;
};
struct GemmKeyHash {
  size_t operator()(const GemmKey& k) const {
    size_t h = std::hash<bool>()(k.accumulate) ^ (std::hash<int>()(static_cast<int>(k.type)) << 1);
    for (int64_t v : {k.M, k.N, k.K, k.as0, k.as1, k.bs0, k.bs1, k.ldc, k.threads})
      h = h * 1000003u ^ std::hash<int64_t>()(v);
    return h;
  }
};
struct Gemm {
  dnnl::memory::desc a, b, c;
  dnnl::matmul matmul;  // empty: no bf16 kernel for this problem (the portable route, without asking again)
};
std::mutex creation_mutex;  // see thread_gemms

// A convolution's geometry, and its primitives: the forward made at first use, the backward
// ones at their first use (from the forward's descriptor, as oneDNN asks).
struct ConvKey {
  int64_t N, C, H, W, O, kh, kw, sh, sw, ph, pw, dh, dw, groups, threads;
  bool bias;
  bool operator==(const ConvKey&) const = default;
};
struct ConvKeyHash {
  size_t operator()(const ConvKey& k) const {
    size_t h = std::hash<bool>()(k.bias);
    for (int64_t v : {k.N, k.C, k.H, k.W, k.O, k.kh, k.kw, k.sh, k.sw, k.ph, k.pw, k.dh, k.dw, k.groups, k.threads})
      h = h * 1000003u ^ std::hash<int64_t>()(v);
    return h;
  }
};
// Where a convolution's operands are reordered between the caller's layout and the kernels'
// (each reorder primitive is made once per convolution, under the creation lock).
enum ReorderSlot { kFwdSrc, kFwdWeights, kFwdDst, kBwdDataDiffDst, kBwdDataWeights, kBwdDataDiffSrc,
                   kBwdWeightsDiffDst, kBwdWeightsSrc, kBwdWeightsDiffWeights, kReorderSlots };

struct Conv {
  bool usable = false;  // false: oneDNN rejected the geometry or offers only its reference kernel
  dnnl::memory::desc x, w, b, y;  // the caller's plain layouts
  dnnl::convolution_forward::primitive_desc fwd_pd;  // also the backward ones' hint
  dnnl::convolution_forward fwd;                     // made at the first forward
  dnnl::reorder reorders[kReorderSlots];
  int bwd_data_state = 0, bwd_weights_state = 0;  // 0 not tried, 1 made, -1 unusable
  dnnl::convolution_backward_data::primitive_desc bwd_data_pd;
  dnnl::convolution_backward_data bwd_data;
  dnnl::convolution_backward_weights::primitive_desc bwd_weights_pd;
  dnnl::convolution_backward_weights bwd_weights;
};

// A thread's buffer for one role of the convolutions' operands in oneDNN's blocked layouts,
// grown to the largest it has held and reused: fresh pages on every call (the reorders' targets
// are as large as the activations) cost more page faults than the blocked kernels save.
class Workspace {
 public:
  Workspace() = default;
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  ~Workspace() { std::free(data_); }
  void* get(size_t bytes) {
    if (bytes > bytes_) {
      std::free(data_);
      data_ = nullptr;
      bytes_ = 0;
      const size_t rounded = (bytes + 63) / 64 * 64;
      data_ = std::aligned_alloc(64, rounded);
      if (data_ == nullptr) fail("[conv2d] out of memory for a {}-byte oneDNN workspace", rounded);
      bytes_ = rounded;
    }
    return data_;
  }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};
enum WorkspaceRole { kSrc, kWeights, kDst, kDiffDst, kDiffSrc, kDiffWeights, kRoles };

struct ThreadGemms {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::unordered_map<GemmKey, Gemm, GemmKeyHash> primitives;
  std::unordered_map<ConvKey, Conv, ConvKeyHash> convs;
  Workspace workspace[kRoles];
  // Released under the creation lock too, at the thread's exit.
  ~ThreadGemms() {
    std::lock_guard lock(creation_mutex);
    primitives.clear();
    convs.clear();
    stream = dnnl::stream();
    engine = dnnl::engine();
  }
};
constexpr size_t kMaxCachedPrimitives = 256;

// Engines and primitives are created through oneDNN's process-wide state (its primitive cache,
// whose lock and entries are set up lazily inside libdnnl, where ThreadSanitizer sees no
// synchronisation): one creation at a time, under a lock of ours. Creations are rare: an engine per
// thread, a primitive per shape per thread.

ThreadGemms& thread_gemms() {
  thread_local std::unique_ptr<ThreadGemms> gemms;
  if (!gemms) {
    std::lock_guard lock(creation_mutex);
    gemms = std::make_unique<ThreadGemms>();
  }
  return *gemms;
}

// The matmul is empty when oneDNN has only its reference (scalar) kernel or none for this problem.
Gemm make_gemm(const dnnl::engine& engine, const GemmKey& k) {
  std::lock_guard lock(creation_mutex);
  Gemm g;
  g.a = dnnl::memory::desc({k.M, k.K}, k.type, dnnl::memory::dims{k.as0, k.as1});
  g.b = dnnl::memory::desc({k.K, k.N}, k.type, dnnl::memory::dims{k.bs0, k.bs1});
  g.c = dnnl::memory::desc({k.M, k.N}, k.type, dnnl::memory::dims{k.ldc, 1});
  dnnl::primitive_attr attr;
  if (k.accumulate) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);  // C += A·B, summed in f32 before C's one rounding
    attr.set_post_ops(ops);
  }
  try {
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(g.a, g.b, g.c), attr, engine);
    if (std::strncmp(pd.impl_info_str(), "ref", 3) != 0) g.matmul = dnnl::matmul(pd);
  } catch (const dnnl::error&) {
  }
  return g;
}

// oneDNN's OpenMP regions use the calling thread's team size: Tandem's intra-op thread count.
void match_team_size() {
  const int threads = intra_op_threads();
  if (omp_get_max_threads() != threads) omp_set_num_threads(threads);
}

bool is_reference(const char* impl) { return std::strncmp(impl, "ref", 3) == 0; }

// The right padding that gives PyTorch's output size (floor division): may be negative, which
// oneDNN takes for its direct kernels or rejects (then im2col runs).
dnnl::memory::dims conv_padding_r(const ConvKey& k, int64_t OH, int64_t OW) {
  return {(OH - 1) * k.sh + (k.kh - 1) * k.dh + 1 - k.H - k.ph, (OW - 1) * k.sw + (k.kw - 1) * k.dw + 1 - k.W - k.pw};
}

Conv make_conv(const dnnl::engine& engine, const ConvKey& k, int64_t OH, int64_t OW) {
  std::lock_guard lock(creation_mutex);
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  Conv c;
  c.x = dnnl::memory::desc({k.N, k.C, k.H, k.W}, dt::f32, tag::nchw);
  c.y = dnnl::memory::desc({k.N, k.O, OH, OW}, dt::f32, tag::nchw);
  c.w = k.groups == 1 ? dnnl::memory::desc({k.O, k.C, k.kh, k.kw}, dt::f32, tag::oihw)
                      : dnnl::memory::desc({k.groups, k.O / k.groups, k.C / k.groups, k.kh, k.kw}, dt::f32, tag::goihw);
  c.b = dnnl::memory::desc({k.O}, dt::f32, tag::x);
  // format_tag::any: oneDNN picks the blocked layouts its fastest kernel reads.
  const dnnl::memory::desc xa({k.N, k.C, k.H, k.W}, dt::f32, tag::any), ya({k.N, k.O, OH, OW}, dt::f32, tag::any),
      wa(c.w.dims(), dt::f32, tag::any);
  try {
    const dnnl::memory::dims strides{k.sh, k.sw}, dilation{k.dh - 1, k.dw - 1}, pad_l{k.ph, k.pw},
        pad_r = conv_padding_r(k, OH, OW);
    const auto desc = k.bias ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training,
                                                               dnnl::algorithm::convolution_direct, xa, wa, c.b, ya,
                                                               strides, dilation, pad_l, pad_r)
                             : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training,
                                                               dnnl::algorithm::convolution_direct, xa, wa, ya, strides,
                                                               dilation, pad_l, pad_r);
    c.fwd_pd = dnnl::convolution_forward::primitive_desc(desc, engine);
    c.usable = !is_reference(c.fwd_pd.impl_info_str());
  } catch (const dnnl::error&) {
  }
  return c;
}

// A backward primitive of c (Desc/Pd/Prim: convolution_backward_data's or _weights'), with the
// forward's descriptor as its hint; `state` becomes 1, or -1 when oneDNN offers only its
// reference kernel or rejects the geometry.
template <class Desc, class Pd, class Prim>
void make_conv_backward(const dnnl::engine& engine, const ConvKey& k, const Conv& c, int& state, Pd& pd, Prim& prim) {
  std::lock_guard lock(creation_mutex);
  state = -1;
  try {
    const int64_t OH = c.y.dims()[2], OW = c.y.dims()[3];
    using dt = dnnl::memory::data_type;
    using tag = dnnl::memory::format_tag;
    const dnnl::memory::desc xa(c.x.dims(), dt::f32, tag::any), ya(c.y.dims(), dt::f32, tag::any),
        wa(c.w.dims(), dt::f32, tag::any);
    const Desc desc(dnnl::algorithm::convolution_direct, xa, wa, ya, {k.sh, k.sw}, {k.dh - 1, k.dw - 1}, {k.ph, k.pw},
                    conv_padding_r(k, OH, OW));
    pd = Pd(desc, engine, c.fwd_pd);
    if (is_reference(pd.impl_info_str())) return;
    prim = Prim(pd);
    state = 1;
  } catch (const dnnl::error&) {
  }
}

ConvKey conv_key(const Conv2dGeometry& g, bool bias) {
  const Window2d& w = g.win;
  return ConvKey{g.N, g.C, w.H, w.W, g.O, w.kh, w.kw, w.sh, w.sw, w.ph, w.pw, w.dh, w.dw, g.groups, intra_op_threads(),
                 bias};
}

// The cached convolution for g (made on first use), or null when oneDNN does not take it.
Conv* find_conv(ThreadGemms& t, const Conv2dGeometry& g, bool bias) {
  if (!onednn_conv_available()) return nullptr;
  const Window2d& w = g.win;
  if (g.N <= 0 || g.C <= 0 || g.O <= 0 || w.H <= 0 || w.W <= 0 || w.OH <= 0 || w.OW <= 0) return nullptr;
  const ConvKey key = conv_key(g, bias);
  auto it = t.convs.find(key);
  if (it == t.convs.end()) {
    if (t.convs.size() >= kMaxCachedPrimitives) {
      std::lock_guard lock(creation_mutex);
      t.convs.clear();
    }
    it = t.convs.emplace(key, make_conv(t.engine, key, w.OH, w.OW)).first;
  }
  return it->second.usable ? &it->second : nullptr;
}

// The reorder `slot` of c from `from` to `to`, made at its first use.
dnnl::reorder& conv_reorder(ThreadGemms& t, Conv& c, ReorderSlot slot, const dnnl::memory& from, const dnnl::memory& to) {
  if (!c.reorders[slot]) {
    std::lock_guard lock(creation_mutex);
    c.reorders[slot] = dnnl::reorder(dnnl::reorder::primitive_desc(t.engine, from.get_desc(), t.engine, to.get_desc()));
  }
  return c.reorders[slot];
}

// `user` as `want` describes it: itself when the layouts agree, else a reordered copy in the
// thread's workspace for `role`.
dnnl::memory in_layout(ThreadGemms& t, Conv& c, ReorderSlot slot, const dnnl::memory& user,
                       const dnnl::memory::desc& want, WorkspaceRole role) {
  if (user.get_desc() == want) return user;
  dnnl::memory m(want, t.engine, t.workspace[role].get(want.get_size()));
  conv_reorder(t, c, slot, user, m).execute(t.stream, const_cast<dnnl::memory&>(user), m);
  return m;
}

// Where a primitive writes `user`: itself when the layouts agree, else the workspace for `role`,
// copied back by out_of_layout.
dnnl::memory out_layout(ThreadGemms& t, const dnnl::memory& user, const dnnl::memory::desc& have, WorkspaceRole role) {
  return user.get_desc() == have ? user : dnnl::memory(have, t.engine, t.workspace[role].get(have.get_size()));
}
void out_of_layout(ThreadGemms& t, Conv& c, ReorderSlot slot, dnnl::memory& inner, dnnl::memory& user) {
  if (inner.get_desc() != user.get_desc()) conv_reorder(t, c, slot, inner, user).execute(t.stream, inner, user);
}

[[noreturn]] void conv_failed(const char* what, const Conv2dGeometry& g, const dnnl::error& e) {
  fail("[conv2d] oneDNN's {} failed for input [{}, {}, {}, {}] and {} output channels: {} (status {})", what, g.N, g.C,
       g.win.H, g.win.W, g.O, e.what(), static_cast<int>(e.status));
}

}  // namespace

namespace {
thread_local int64_t conv_runs = 0;  // onednn_conv_runs
}  // namespace

bool onednn_conv_available() {
  static const bool available = !onednn_switched_off();
  return available;
}

int64_t onednn_conv_runs() { return conv_runs; }

bool onednn_conv2d_forward(const Conv2dGeometry& g, const float* x, const float* w, const float* bias, float* y) {
  // The team size first: a primitive made below takes its thread count from it.
  match_team_size();
  ThreadGemms& t = thread_gemms();
  Conv* c = find_conv(t, g, bias != nullptr);
  if (!c) return false;
  if (!c->fwd) {
    std::lock_guard lock(creation_mutex);
    c->fwd = dnnl::convolution_forward(c->fwd_pd);
  }
  try {
    dnnl::memory xm(c->x, t.engine, const_cast<float*>(x)), wm(c->w, t.engine, const_cast<float*>(w)),
        ym(c->y, t.engine, y);
    dnnl::memory xi = in_layout(t, *c, kFwdSrc, xm, c->fwd_pd.src_desc(), kSrc),
                 wi = in_layout(t, *c, kFwdWeights, wm, c->fwd_pd.weights_desc(), kWeights);
    dnnl::memory yi = out_layout(t, ym, c->fwd_pd.dst_desc(), kDst);
    std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, xi}, {DNNL_ARG_WEIGHTS, wi}, {DNNL_ARG_DST, yi}};
    if (bias) args.emplace(DNNL_ARG_BIAS, dnnl::memory(c->b, t.engine, const_cast<float*>(bias)));
    c->fwd.execute(t.stream, args);
    out_of_layout(t, *c, kFwdDst, yi, ym);
    t.stream.wait();
  } catch (const dnnl::error& e) {
    conv_failed("convolution", g, e);
  }
  ++conv_runs;
  return true;
}

bool onednn_conv2d_backward(const Conv2dGeometry& g, const float* gy, const float* x, const float* w, float* gx,
                            float* gw) {
  match_team_size();  // before any primitive is made (see onednn_conv2d_forward)
  ThreadGemms& t = thread_gemms();
  Conv* c = find_conv(t, g, false);
  if (!c) return false;
  if (gx && c->bwd_data_state == 0)
    make_conv_backward<dnnl::convolution_backward_data::desc>(t.engine, conv_key(g, false), *c, c->bwd_data_state,
                                                              c->bwd_data_pd, c->bwd_data);
  if (gw && c->bwd_weights_state == 0)
    make_conv_backward<dnnl::convolution_backward_weights::desc>(t.engine, conv_key(g, false), *c,
                                                                 c->bwd_weights_state, c->bwd_weights_pd,
                                                                 c->bwd_weights);
  if ((gx && c->bwd_data_state < 0) || (gw && c->bwd_weights_state < 0)) return false;
  try {
    dnnl::memory gym(c->y, t.engine, const_cast<float*>(gy));
    // Both gradients read the output gradient, usually in the same blocked layout: reordered once.
    dnnl::memory gyi;
    auto diff_dst = [&](ReorderSlot slot, const dnnl::memory::desc& want) {
      if (!gyi || gyi.get_desc() != want) gyi = in_layout(t, *c, slot, gym, want, kDiffDst);
      return gyi;
    };
    if (gx) {
      dnnl::memory wm(c->w, t.engine, const_cast<float*>(w)), gxm(c->x, t.engine, gx);
      dnnl::memory wi = in_layout(t, *c, kBwdDataWeights, wm, c->bwd_data_pd.weights_desc(), kWeights);
      dnnl::memory gxi = out_layout(t, gxm, c->bwd_data_pd.diff_src_desc(), kDiffSrc);
      c->bwd_data.execute(t.stream, {{DNNL_ARG_DIFF_DST, diff_dst(kBwdDataDiffDst, c->bwd_data_pd.diff_dst_desc())},
                                     {DNNL_ARG_WEIGHTS, wi},
                                     {DNNL_ARG_DIFF_SRC, gxi}});
      out_of_layout(t, *c, kBwdDataDiffSrc, gxi, gxm);
    }
    if (gw) {
      dnnl::memory xm(c->x, t.engine, const_cast<float*>(x)), gwm(c->w, t.engine, gw);
      dnnl::memory xi = in_layout(t, *c, kBwdWeightsSrc, xm, c->bwd_weights_pd.src_desc(), kSrc);
      dnnl::memory gwi = out_layout(t, gwm, c->bwd_weights_pd.diff_weights_desc(), kDiffWeights);
      c->bwd_weights.execute(t.stream,
                             {{DNNL_ARG_DIFF_DST, diff_dst(kBwdWeightsDiffDst, c->bwd_weights_pd.diff_dst_desc())},
                              {DNNL_ARG_SRC, xi},
                              {DNNL_ARG_DIFF_WEIGHTS, gwi}});
      out_of_layout(t, *c, kBwdWeightsDiffWeights, gwi, gwm);
    }
    t.stream.wait();
  } catch (const dnnl::error& e) {
    conv_failed("convolution gradient", g, e);
  }
  ++conv_runs;
  return true;
}

bool onednn_bf16_available() {
  static const bool available = cpu_has_bf16_gemm();
  return available;
}

namespace {

// OpenBLAS 0.3.21 does not know AMD's Zen 4 and Zen 5 and runs its AVX2 (Haswell) kernels there;
// oneDNN's f32 matmul uses the AVX-512 the CPU has: twice OpenBLAS's rate on a Zen 5 core
// (240 vs 124 GFLOP/s at 512), about the same on a CPU whose AVX-512 is 256 bits wide inside.
// Where OpenBLAS runs one of its AVX-512 kernels, it stays.
extern "C" char* openblas_get_corename();
bool openblas_has_avx512_kernels() {
  const char* core = openblas_get_corename();
  if (core == nullptr) return false;
  for (const char* name : {"SkylakeX", "Cooperlake", "SapphireRapids"})
    if (std::strcmp(core, name) == 0) return true;
  return false;
}

bool cpu_prefers_onednn_f32_gemm() {
  if (onednn_switched_off()) return false;
  try {
    const auto want = static_cast<unsigned>(dnnl::cpu_isa::avx512_core);
    if ((static_cast<unsigned>(dnnl::get_effective_cpu_isa()) & want) != want) return false;
  } catch (const dnnl::error&) {
    return false;
  }
  return !openblas_has_avx512_kernels();
}

// C = A·B (+ C) through a cached matmul primitive of element type T (bf16 or f32).
template <class T>
bool onednn_gemm(int64_t M, int64_t N, int64_t K, const T* a, int64_t as0, int64_t as1, const T* b, int64_t bs0,
                 int64_t bs1, T* c, int64_t ldc, bool accumulate, const char* op) {
  constexpr bool is_bf16 = std::is_same_v<T, BFloat16>;
  // oneDNN's fast kernels read plain layouts (one unit stride per operand), as BLAS does; the
  // layout blas_layout gives also settles size-1 dims' strides, so equal problems share a key.
  bool a_trans, b_trans;
  int64_t lda, ldb;
  if (!blas_layout(M, K, as0, as1, a_trans, lda) || !blas_layout(K, N, bs0, bs1, b_trans, ldb)) return false;
  match_team_size();  // before the primitive is made: it takes its thread count from the team size
  const GemmKey key{M,
                    N,
                    K,
                    a_trans ? 1 : lda,
                    a_trans ? lda : 1,
                    b_trans ? 1 : ldb,
                    b_trans ? ldb : 1,
                    ldc,
                    intra_op_threads(),
                    accumulate,
                    is_bf16 ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32};
  ThreadGemms& gemms = thread_gemms();
  auto it = gemms.primitives.find(key);
  if (it == gemms.primitives.end()) {
    if (gemms.primitives.size() >= kMaxCachedPrimitives) {
      std::lock_guard lock(creation_mutex);
      gemms.primitives.clear();
    }
    it = gemms.primitives.emplace(key, make_gemm(gemms.engine, key)).first;
  }
  const Gemm& gemm = it->second;
  if (!gemm.matmul) return false;
  try {
    dnnl::memory am(gemm.a, gemms.engine, const_cast<T*>(a));
    dnnl::memory bm(gemm.b, gemms.engine, const_cast<T*>(b));
    dnnl::memory cm(gemm.c, gemms.engine, c);
    gemm.matmul.execute(gemms.stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
    gemms.stream.wait();
  } catch (const dnnl::error& e) {
    fail("[{}] oneDNN's {} matmul failed for A {}x{} · B {}x{}: {} (status {})", op, is_bf16 ? "bf16" : "f32", M, K,
         K, N, e.what(), static_cast<int>(e.status));
  }
  return true;
}

}  // namespace

bool onednn_bf16_gemm(int64_t M, int64_t N, int64_t K, const BFloat16* a, int64_t as0, int64_t as1,
                      const BFloat16* b, int64_t bs0, int64_t bs1, BFloat16* c, int64_t ldc, bool accumulate,
                      const char* op) {
  if (!onednn_bf16_available() || M <= 0 || N <= 0 || K <= 0) return false;
  return onednn_gemm(M, N, K, a, as0, as1, b, bs0, bs1, c, ldc, accumulate, op);
}

bool onednn_f32_gemm_preferred() {
  static const bool preferred = cpu_prefers_onednn_f32_gemm();
  return preferred;
}

bool onednn_f32_gemm(int64_t M, int64_t N, int64_t K, const float* a, int64_t as0, int64_t as1, const float* b,
                     int64_t bs0, int64_t bs1, float* c, int64_t ldc, bool accumulate, const char* op) {
  if (!onednn_f32_gemm_preferred() || M <= 0 || N <= 0 || K <= 0) return false;
  return onednn_gemm(M, N, K, a, as0, as1, b, bs0, bs1, c, ldc, accumulate, op);
}

#else  // no oneDNN: always the portable route

bool onednn_conv_available() { return false; }
int64_t onednn_conv_runs() { return 0; }
bool onednn_conv2d_forward(const Conv2dGeometry&, const float*, const float*, const float*, float*) { return false; }
bool onednn_conv2d_backward(const Conv2dGeometry&, const float*, const float*, const float*, float*, float*) {
  return false;
}

bool onednn_bf16_available() { return false; }
bool onednn_f32_gemm_preferred() { return false; }
bool onednn_f32_gemm(int64_t, int64_t, int64_t, const float*, int64_t, int64_t, const float*, int64_t, int64_t, float*,
                     int64_t, bool, const char*) {
  return false;
}

bool onednn_bf16_gemm(int64_t, int64_t, int64_t, const BFloat16*, int64_t, int64_t, const BFloat16*, int64_t, int64_t,
                      BFloat16*, int64_t, bool, const char*) {
  return false;
}

#endif

}  // namespace tandem::detail
