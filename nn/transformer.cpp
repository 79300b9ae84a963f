#include "nn/transformer.h"

#include <cmath>
#include <limits>

#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "nn/init.h"

namespace tandem::nn {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

Tensor input_at(const TensorList& inputs, size_t i) { return i < inputs.size() ? inputs[i] : Tensor(); }

// The mask as one to add to the scores: -inf where a bool mask is true (not allowed).
Tensor additive(const Tensor& mask, Dtype dtype) {
  if (mask.dtype() != boolean) return mask;
  return masked_fill(zeros(mask.shape(), TensorOptions(dtype, mask.device())), mask, kNegInf);
}

const char* activation_name(Activation a) { return a == Activation::relu ? "relu" : "gelu"; }

Tensor activate(Activation a, const Tensor& x) { return a == Activation::relu ? relu(x) : gelu(x); }

void check_layer_options(const char* layer, int64_t d_model, int64_t nhead, const TransformerLayerOptions& o) {
  TANDEM_CHECK(d_model > 0 && nhead > 0, "[{}] d_model and nhead must be positive, got {} and {}", layer, d_model,
               nhead);
  TANDEM_CHECK(d_model % nhead == 0, "[{}] d_model {} is not divisible by nhead {}", layer, d_model, nhead);
  TANDEM_CHECK(o.dim_feedforward > 0, "[{}] dim_feedforward must be positive, got {}", layer, o.dim_feedforward);
  TANDEM_CHECK(o.dropout >= 0 && o.dropout < 1, "[{}] dropout must be in [0, 1), got {}", layer, o.dropout);
  TANDEM_CHECK(o.layer_norm_eps > 0, "[{}] layer_norm_eps must be positive, got {}", layer, o.layer_norm_eps);
}

// A layer's sequence input: what MultiheadAttention would reject, said in the layer's terms.
void check_sequence(const char* layer, const char* name, const Tensor& x, int64_t d_model, bool batch_first) {
  TANDEM_CHECK(x.defined(), "[{}] {} must be a defined tensor", layer, name);
  TANDEM_CHECK((x.dim() == 2 || x.dim() == 3) && x.size(-1) == d_model,
               "[{}] expected {} of shape {} or unbatched [L, {}] (d_model {}), got {}", layer, name,
               batch_first ? fmt::format("[N, L, {}]", d_model) : fmt::format("[L, N, {}]", d_model), d_model, d_model,
               x.shape());
}

}  // namespace

// ---- MultiheadAttention ----

// The projected inputs split into heads, batch first, and the masks merged into one that
// broadcasts to [N, num_heads, L, S]: bool (true attends, scaled_dot_product_attention's sense) or
// additive.
struct MultiheadAttention::Heads {
  Tensor q, k, v;  // [N, H, L, D], [N, H, S, D], [N, H, S, D]
  Tensor mask;
  int64_t N = 0, L = 0, S = 0;
  bool batched = true;
};

MultiheadAttention::MultiheadAttention(int64_t embed_dim, int64_t num_heads, double dropout, bool bias,
                                       bool batch_first)
    : Module("MultiheadAttention"), embed_dim(embed_dim), num_heads(num_heads), head_dim(0), dropout(dropout),
      batch_first(batch_first) {
  TANDEM_CHECK(embed_dim > 0 && num_heads > 0,
               "[MultiheadAttention] embed_dim and num_heads must be positive, got {} and {}", embed_dim, num_heads);
  TANDEM_CHECK(embed_dim % num_heads == 0, "[MultiheadAttention] embed_dim {} is not divisible by num_heads {}",
               embed_dim, num_heads);
  // 1 would drop every attention weight; the fused attention refuses it, and no model wants it.
  TANDEM_CHECK(dropout >= 0 && dropout < 1, "[MultiheadAttention] dropout must be in [0, 1), got {}", dropout);
  head_dim = embed_dim / num_heads;
  // PyTorch builds out_proj (drawing Linear's init) before _reset_parameters draws in_proj_weight.
  out_proj = register_module("out_proj", std::make_shared<Linear>(embed_dim, embed_dim, bias));
  in_proj_weight = register_parameter("in_proj_weight", empty({3 * embed_dim, embed_dim}));
  if (bias) in_proj_bias = register_parameter("in_proj_bias", empty({3 * embed_dim}));
  reset_parameters();
}

void MultiheadAttention::reset_parameters() {
  // PyTorch's _reset_parameters: out_proj.weight keeps Linear's init.
  init::xavier_uniform_(in_proj_weight);
  if (in_proj_bias.defined()) {
    init::zeros_(in_proj_bias);
    init::zeros_(out_proj->bias);
  }
}

std::string MultiheadAttention::extra_repr() const {
  return fmt::format("embed_dim={}, num_heads={}, dropout={}, bias={}, batch_first={}", embed_dim, num_heads, dropout,
                     in_proj_bias.defined(), batch_first);
}

void MultiheadAttention::parameter_replaced(const std::string& name, const Tensor& tensor) {
  if (name == "in_proj_weight") in_proj_weight = tensor;
  if (name == "in_proj_bias") in_proj_bias = tensor;
}

MultiheadAttention::Heads MultiheadAttention::project(const Tensor& query, const Tensor& key_in, const Tensor& value_in,
                                                      const Tensor& key_padding_mask, const Tensor& attn_mask,
                                                      bool additive_mask) {
  TANDEM_CHECK(query.defined(), "[MultiheadAttention] query must be a defined tensor");
  const Tensor key = key_in.defined() ? key_in : query;
  const Tensor value = value_in.defined() ? value_in : key;
  const Dtype dtype = query.dtype();
  TANDEM_CHECK(query.is_floating_point() && key.dtype() == dtype && value.dtype() == dtype,
               "[MultiheadAttention] query, key and value must have one floating dtype, got {}, {}, {}", dtype,
               key.dtype(), value.dtype());
  TANDEM_CHECK(dtype == in_proj_weight.dtype(),
               "[MultiheadAttention] the inputs are {} but the parameters are {} (convert one with to())", dtype,
               in_proj_weight.dtype());
  TANDEM_CHECK((query.dim() == 2 || query.dim() == 3) && query.size(-1) == embed_dim,
               "[MultiheadAttention] expected query of shape {} or unbatched [L, {}] (embed_dim {}), got {}",
               batch_first ? fmt::format("[N, L, {}]", embed_dim) : fmt::format("[L, N, {}]", embed_dim), embed_dim,
               embed_dim, query.shape());
  const bool batched = query.dim() == 3;
  TANDEM_CHECK(key.dim() == query.dim() && key.shape() == value.shape() && key.size(-1) == embed_dim,
               "[MultiheadAttention] key and value must have one shape, of query's rank and last dim {}; got "
               "query {}, key {}, value {}",
               embed_dim, query.shape(), key.shape(), value.shape());
  const int64_t batch_dim = batch_first ? 0 : 1, seq_dim = batch_first ? 1 : 0;
  TANDEM_CHECK(!batched || key.size(batch_dim) == query.size(batch_dim),
               "[MultiheadAttention] query and key have different batch sizes (dim {}, batch_first={}): query {}, "
               "key {}",
               batch_dim, batch_first, query.shape(), key.shape());

  Heads h;
  h.batched = batched;
  h.N = batched ? query.size(batch_dim) : 1;
  h.L = batched ? query.size(seq_dim) : query.size(0);
  h.S = batched ? key.size(seq_dim) : key.size(0);

  auto check_mask_dtype = [&](const Tensor& m, const char* name) {
    TANDEM_CHECK(m.dtype() == boolean || m.dtype() == dtype,
                 "[MultiheadAttention] {} must be bool (true: not allowed) or the query's dtype {} (added), got {}",
                 name, dtype, m.dtype());
  };
  Tensor padding, mask;  // as [N, 1, 1, S] and [L, S] or [N, H, L, S]
  if (key_padding_mask.defined()) {
    check_mask_dtype(key_padding_mask, "key_padding_mask");
    const Shape want = batched ? Shape{h.N, h.S} : Shape{h.S};
    TANDEM_CHECK(key_padding_mask.shape() == want,
                 "[MultiheadAttention] expected key_padding_mask of shape {} ({}), got {}", want,
                 batched ? "[N, S]" : "[S] for unbatched input", key_padding_mask.shape());
    padding = reshape(key_padding_mask, {h.N, 1, 1, h.S});
  }
  if (attn_mask.defined()) {
    check_mask_dtype(attn_mask, "attn_mask");
    const Shape shared{h.L, h.S};
    const Shape per_head = batched ? Shape{h.N * num_heads, h.L, h.S} : Shape{num_heads, h.L, h.S};
    TANDEM_CHECK(attn_mask.shape() == shared || attn_mask.shape() == per_head,
                 "[MultiheadAttention] expected attn_mask of shape {} ([L, S]) or {} ({}), got {}", shared, per_head,
                 batched ? "[N * num_heads, L, S]" : "[num_heads, L, S]", attn_mask.shape());
    mask = attn_mask.dim() == 2 ? attn_mask : reshape(attn_mask, {h.N, num_heads, h.L, h.S});
  }
  const bool both_bool =
      (!padding.defined() || padding.dtype() == boolean) && (!mask.defined() || mask.dtype() == boolean);
  if (both_bool && !additive_mask) {
    // Kept bool: the fused attention skips masked keys without reading an L x S float mask.
    Tensor blocked = padding.defined() ? padding : mask;
    if (padding.defined() && mask.defined()) blocked = logical_or(mask, padding);
    if (blocked.defined()) h.mask = logical_not(blocked);
  } else {
    if (padding.defined()) h.mask = additive(padding, dtype);
    if (mask.defined()) h.mask = h.mask.defined() ? add(additive(mask, dtype), h.mask) : additive(mask, dtype);
  }

  // Batch first, [N, L, E]: unbatched input is a batch of one.
  auto batch_major = [&](const Tensor& t) { return !batched ? unsqueeze(t, 0) : batch_first ? t : transpose(t, 0, 1); };
  const Tensor q = batch_major(query), k = batch_major(key), v = batch_major(value);
  const int64_t E = embed_dim;
  auto weight = [&](int64_t first, int64_t n) { return narrow(in_proj_weight, 0, first * E, n * E); };
  auto bias = [&](int64_t first, int64_t n) {
    return in_proj_bias.defined() ? narrow(in_proj_bias, 0, first * E, n * E) : Tensor();
  };
  // One product where inputs are shared, as PyTorch's _in_projection_packed.
  Tensor pq, pk, pv;
  if (key.is_same(query) && value.is_same(query)) {
    TensorList qkv = chunk(linear(q, in_proj_weight, in_proj_bias), 3, -1);
    pq = qkv[0], pk = qkv[1], pv = qkv[2];
  } else if (value.is_same(key)) {
    pq = linear(q, weight(0, 1), bias(0, 1));
    TensorList kv = chunk(linear(k, weight(1, 2), bias(1, 2)), 2, -1);
    pk = kv[0], pv = kv[1];
  } else {
    pq = linear(q, weight(0, 1), bias(0, 1));
    pk = linear(k, weight(1, 1), bias(1, 1));
    pv = linear(v, weight(2, 1), bias(2, 1));
  }
  auto split_heads = [&](const Tensor& t) {
    return transpose(reshape(t, {t.size(0), t.size(1), num_heads, head_dim}), 1, 2);
  };
  h.q = split_heads(pq);
  h.k = split_heads(pk);
  h.v = split_heads(pv);
  return h;
}

Tensor MultiheadAttention::finish(const Heads& h, const Tensor& attended) {
  Tensor merged = reshape(transpose(attended, 1, 2), {h.N, h.L, embed_dim});
  // Through out_proj's call, so its pre-forward hooks run (PyTorch applies its parameters
  // functionally): DDP's mixed precision waits there for out_proj's cast on a side stream.
  Tensor out = (*out_proj)(merged);
  if (!h.batched) return squeeze(out, 0);
  return batch_first ? out : transpose(out, 0, 1);
}

Tensor MultiheadAttention::forward_inputs(const TensorList& inputs) {
  TANDEM_CHECK(!inputs.empty() && inputs.size() <= 5,
               "[MultiheadAttention] takes 1 to 5 inputs {{query, key, value, key_padding_mask, attn_mask}}, got {}",
               inputs.size());
  Heads h = project(inputs[0], input_at(inputs, 1), input_at(inputs, 2), input_at(inputs, 3), input_at(inputs, 4),
                    /*additive_mask=*/false);
  const double p = is_training() ? dropout : 0.0;
  return finish(h, scaled_dot_product_attention(h.q, h.k, h.v, h.mask, p));
}

std::pair<Tensor, Tensor> MultiheadAttention::forward_with_weights(const Tensor& query, const Tensor& key,
                                                                   const Tensor& value, const Tensor& key_padding_mask,
                                                                   const Tensor& attn_mask, bool average_attn_weights) {
  // The hooks see (and may replace) the inputs, as in a PyTorch call with need_weights=True.
  const TensorList in = run_pre_forward_hooks(TensorList{query, key, value, key_padding_mask, attn_mask});
  Heads h = project(in[0], in[1], in[2], in[3], in[4], /*additive_mask=*/true);
  Tensor scores = matmul(div(h.q, std::sqrt(static_cast<double>(head_dim))), transpose(h.k, -2, -1));
  Tensor weights;
  if (h.mask.defined()) {
    // A query whose keys are all masked would get NaN from the softmax (and NaN gradients through
    // it); the fused attention gives such a row 0, and so do these weights.
    Tensor dead;
    {
      NoGradGuard guard;
      dead = eq(amax(h.mask.detach(), {-1}, /*keepdim=*/true), kNegInf);
    }
    weights = where(dead, 0.0, softmax(add(scores, where(dead, 0.0, h.mask)), -1));
  } else {
    weights = softmax(scores, -1);
  }
  if (is_training() && dropout > 0) weights = tandem::dropout(weights, dropout, true);
  Tensor out = finish(h, matmul(weights, h.v));
  if (average_attn_weights) weights = mean(weights, {1});
  if (!h.batched) weights = squeeze(weights, 0);
  return {out, weights};
}

// ---- TransformerEncoderLayer ----

TransformerEncoderLayer::TransformerEncoderLayer(int64_t d_model, int64_t nhead, TransformerLayerOptions options)
    : Module("TransformerEncoderLayer"), d_model(d_model), options(options) {
  check_layer_options("TransformerEncoderLayer", d_model, nhead, options);
  self_attn = register_module(
      "self_attn", std::make_shared<MultiheadAttention>(d_model, nhead, options.dropout, true, options.batch_first));
  linear1 = register_module("linear1", std::make_shared<Linear>(d_model, options.dim_feedforward));
  dropout = register_module("dropout", std::make_shared<Dropout>(options.dropout));
  linear2 = register_module("linear2", std::make_shared<Linear>(options.dim_feedforward, d_model));
  norm1 = register_module("norm1", std::make_shared<LayerNorm>(Shape{d_model}, options.layer_norm_eps));
  norm2 = register_module("norm2", std::make_shared<LayerNorm>(Shape{d_model}, options.layer_norm_eps));
  dropout1 = register_module("dropout1", std::make_shared<Dropout>(options.dropout));
  dropout2 = register_module("dropout2", std::make_shared<Dropout>(options.dropout));
}

TransformerEncoderLayer::TransformerEncoderLayer(int64_t d_model, int64_t nhead, int64_t dim_feedforward,
                                                 double dropout, Activation activation, double layer_norm_eps,
                                                 bool batch_first, bool norm_first)
    : TransformerEncoderLayer(
          d_model, nhead,
          TransformerLayerOptions{dim_feedforward, dropout, activation, layer_norm_eps, batch_first, norm_first}) {}

Tensor TransformerEncoderLayer::forward_inputs(const TensorList& inputs) {
  TANDEM_CHECK(!inputs.empty() && inputs.size() <= 3,
               "[TransformerEncoderLayer] takes 1 to 3 inputs {{src, src_mask, src_key_padding_mask}}, got {}",
               inputs.size());
  check_sequence("TransformerEncoderLayer", "src", inputs[0], d_model, options.batch_first);
  const Tensor src_mask = input_at(inputs, 1), padding = input_at(inputs, 2);
  auto self_attention = [&](const Tensor& x) { return (*dropout1)(self_attn->call({x, x, x, padding, src_mask})); };
  auto feed_forward = [&](const Tensor& x) {
    return (*dropout2)((*linear2)((*dropout)(activate(options.activation, (*linear1)(x)))));
  };
  Tensor x = inputs[0];
  if (options.norm_first) {
    x = x + self_attention((*norm1)(x));
    x = x + feed_forward((*norm2)(x));
  } else {
    x = (*norm1)(x + self_attention(x));
    x = (*norm2)(x + feed_forward(x));
  }
  return x;
}

std::string TransformerEncoderLayer::extra_repr() const {
  return fmt::format("activation={}, norm_first={}", activation_name(options.activation), options.norm_first);
}

// ---- TransformerDecoderLayer ----

TransformerDecoderLayer::TransformerDecoderLayer(int64_t d_model, int64_t nhead, TransformerLayerOptions options)
    : Module("TransformerDecoderLayer"), d_model(d_model), options(options) {
  check_layer_options("TransformerDecoderLayer", d_model, nhead, options);
  self_attn = register_module(
      "self_attn", std::make_shared<MultiheadAttention>(d_model, nhead, options.dropout, true, options.batch_first));
  multihead_attn = register_module("multihead_attn", std::make_shared<MultiheadAttention>(
                                                         d_model, nhead, options.dropout, true, options.batch_first));
  linear1 = register_module("linear1", std::make_shared<Linear>(d_model, options.dim_feedforward));
  dropout = register_module("dropout", std::make_shared<Dropout>(options.dropout));
  linear2 = register_module("linear2", std::make_shared<Linear>(options.dim_feedforward, d_model));
  norm1 = register_module("norm1", std::make_shared<LayerNorm>(Shape{d_model}, options.layer_norm_eps));
  norm2 = register_module("norm2", std::make_shared<LayerNorm>(Shape{d_model}, options.layer_norm_eps));
  norm3 = register_module("norm3", std::make_shared<LayerNorm>(Shape{d_model}, options.layer_norm_eps));
  dropout1 = register_module("dropout1", std::make_shared<Dropout>(options.dropout));
  dropout2 = register_module("dropout2", std::make_shared<Dropout>(options.dropout));
  dropout3 = register_module("dropout3", std::make_shared<Dropout>(options.dropout));
}

TransformerDecoderLayer::TransformerDecoderLayer(int64_t d_model, int64_t nhead, int64_t dim_feedforward,
                                                 double dropout, Activation activation, double layer_norm_eps,
                                                 bool batch_first, bool norm_first)
    : TransformerDecoderLayer(
          d_model, nhead,
          TransformerLayerOptions{dim_feedforward, dropout, activation, layer_norm_eps, batch_first, norm_first}) {}

Tensor TransformerDecoderLayer::forward_inputs(const TensorList& inputs) {
  TANDEM_CHECK(inputs.size() >= 2 && inputs.size() <= 6 && inputs[1].defined(),
               "[TransformerDecoderLayer] takes {{tgt, memory, tgt_mask, memory_mask, tgt_key_padding_mask, "
               "memory_key_padding_mask}}, tgt and memory required; got {} input{}{}",
               inputs.size(), inputs.size() == 1 ? "" : "s",
               inputs.size() >= 2 && !inputs[1].defined() ? " with memory undefined" : "");
  check_sequence("TransformerDecoderLayer", "tgt", inputs[0], d_model, options.batch_first);
  check_sequence("TransformerDecoderLayer", "memory", inputs[1], d_model, options.batch_first);
  TANDEM_CHECK(inputs[1].dim() == inputs[0].dim(),
               "[TransformerDecoderLayer] tgt and memory must both be batched or both unbatched, got tgt {} and "
               "memory {}",
               inputs[0].shape(), inputs[1].shape());
  const Tensor memory = inputs[1];
  const Tensor tgt_mask = input_at(inputs, 2), memory_mask = input_at(inputs, 3);
  const Tensor tgt_padding = input_at(inputs, 4), memory_padding = input_at(inputs, 5);
  auto self_attention = [&](const Tensor& x) { return (*dropout1)(self_attn->call({x, x, x, tgt_padding, tgt_mask})); };
  auto cross_attention = [&](const Tensor& x) {
    return (*dropout2)(multihead_attn->call({x, memory, memory, memory_padding, memory_mask}));
  };
  auto feed_forward = [&](const Tensor& x) {
    return (*dropout3)((*linear2)((*dropout)(activate(options.activation, (*linear1)(x)))));
  };
  Tensor x = inputs[0];
  if (options.norm_first) {
    x = x + self_attention((*norm1)(x));
    x = x + cross_attention((*norm2)(x));
    x = x + feed_forward((*norm3)(x));
  } else {
    x = (*norm1)(x + self_attention(x));
    x = (*norm2)(x + cross_attention(x));
    x = (*norm3)(x + feed_forward(x));
  }
  return x;
}

std::string TransformerDecoderLayer::extra_repr() const {
  return fmt::format("activation={}, norm_first={}", activation_name(options.activation), options.norm_first);
}

}  // namespace tandem::nn
