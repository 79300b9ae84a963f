// Attention layers with PyTorch's semantics and parameter names, so a state dict saved by
// torch.nn.MultiheadAttention / TransformerEncoderLayer / TransformerDecoderLayer (1.13 and later)
// loads here by the same keys, and the same inputs give the same outputs and gradients.
//
// Masks follow nn.MultiheadAttention, not scaled_dot_product_attention: a bool mask is true where
// attending is NOT allowed; a float mask (the query's dtype) is added to the scores. Both kinds may
// be mixed: each becomes an additive mask (-inf where a bool one is true) and the two are summed,
// as PyTorch 2.x does (1.13 refuses two float masks and reads a float key_padding_mask beside a
// bool attn_mask as bool). Byte masks, deprecated in PyTorch, are refused.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "nn/layers.h"
#include "nn/module.h"

namespace tandem::nn {

// Multi-head attention, torch.nn.MultiheadAttention with kdim = vdim = embed_dim, no bias_k/bias_v
// and no zero attention: kdim/vdim, add_bias_kv and add_zero_attn are not supported (the
// Transformer layers never use them; kdim/vdim would need PyTorch's separate q/k/v_proj_weight).
//
// Parameters: in_proj_weight [3E, E] (xavier_uniform), in_proj_bias [3E] (zeros) with bias, and the
// child out_proj (Linear E -> E; its bias zeroed). Inputs (forward_inputs, at most 5):
//   {query, key, value, key_padding_mask, attn_mask}
// query [N, L, E] (batch_first) or [L, N, E], or unbatched [L, E] whatever batch_first; key and
// value have query's rank and key's shape ([N, S, E] ...). An undefined or absent key means
// self-attention on query; an undefined or absent value means value = key.
//   key_padding_mask [N, S] (unbatched: [S]), per batch element and key;
//   attn_mask [L, S] for every batch element and head, or [N * num_heads, L, S] (unbatched:
//   [num_heads, L, S]), batch element n's head h at index n * num_heads + h.
// The attention itself is the fused scaled_dot_product_attention, with dropout (the attention
// weights') only in training. A query whose keys are all masked gets 0 from the attention, so its
// output is out_proj's bias and no gradient flows through it; PyTorch gives NaN there.
class MultiheadAttention : public Module {
 public:
  MultiheadAttention(int64_t embed_dim, int64_t num_heads, double dropout = 0, bool bias = true,
                     bool batch_first = false);

  Tensor forward_inputs(const TensorList& inputs) override;
  size_t max_inputs() const override { return 5; }

  // PyTorch's forward with need_weights=true: the output (equal to forward's, up to rounding) and
  // the attention weights, computed explicitly ([N, L, S] averaged over heads, or
  // [N, num_heads, L, S]; unbatched without N). As in PyTorch 1.13, the weights returned are those
  // the output used: after dropout in training. A fully masked query's weights are 0. The
  // pre-forward hooks run first, as in a call, and see the five inputs.
  std::pair<Tensor, Tensor> forward_with_weights(const Tensor& query, const Tensor& key, const Tensor& value,
                                                 const Tensor& key_padding_mask = Tensor(),
                                                 const Tensor& attn_mask = Tensor(), bool average_attn_weights = true);

  void reset_parameters();
  std::string extra_repr() const override;

  int64_t embed_dim, num_heads, head_dim;
  double dropout;
  bool batch_first;
  Tensor in_proj_weight;
  Tensor in_proj_bias;  // undefined without bias
  std::shared_ptr<Linear> out_proj;

 protected:
  void parameter_replaced(const std::string& name, const Tensor& tensor) override;

 private:
  struct Heads;
  Heads project(const Tensor& query, const Tensor& key, const Tensor& value, const Tensor& key_padding_mask,
                const Tensor& attn_mask, bool additive_mask);
  Tensor finish(const Heads& h, const Tensor& attended);
};

enum class Activation { relu, gelu };

// What TransformerEncoderLayer and TransformerDecoderLayer take beyond d_model and nhead, with
// PyTorch's defaults:
//   nn::TransformerEncoderLayer layer(256, 4, {.dim_feedforward = 1024, .norm_first = true});
struct TransformerLayerOptions {
  int64_t dim_feedforward = 2048;
  double dropout = 0.1;  // after attention and in the feed-forward block, and of the attention weights
  Activation activation = Activation::relu;
  double layer_norm_eps = 1e-5;
  bool batch_first = false;
  bool norm_first = false;  // pre-norm (x + f(norm(x))) instead of post-norm (norm(x + f(x)))
};

// torch.nn.TransformerEncoderLayer: self-attention then a feed-forward block, each with a residual
// and a LayerNorm. Children (PyTorch's names): self_attn, linear1, dropout, linear2, norm1, norm2,
// dropout1, dropout2; the activation is a function, not a child, as in PyTorch's state dict.
// Inputs (forward_inputs, at most 3): {src, src_mask, src_key_padding_mask}, the masks as
// MultiheadAttention's attn_mask and key_padding_mask.
class TransformerEncoderLayer : public Module {
 public:
  TransformerEncoderLayer(int64_t d_model, int64_t nhead, TransformerLayerOptions options = {});
  TransformerEncoderLayer(int64_t d_model, int64_t nhead, int64_t dim_feedforward, double dropout = 0.1,
                          Activation activation = Activation::relu, double layer_norm_eps = 1e-5,
                          bool batch_first = false, bool norm_first = false);

  Tensor forward_inputs(const TensorList& inputs) override;
  size_t max_inputs() const override { return 3; }
  std::string extra_repr() const override;

  int64_t d_model;
  TransformerLayerOptions options;
  std::shared_ptr<MultiheadAttention> self_attn;
  std::shared_ptr<Linear> linear1;
  std::shared_ptr<Dropout> dropout;
  std::shared_ptr<Linear> linear2;
  std::shared_ptr<LayerNorm> norm1, norm2;
  std::shared_ptr<Dropout> dropout1, dropout2;
};

// torch.nn.TransformerDecoderLayer: self-attention, attention over the encoder's output (memory),
// then a feed-forward block. Children: self_attn, multihead_attn, linear1, dropout, linear2, norm1,
// norm2, norm3, dropout1, dropout2, dropout3. Inputs (forward_inputs, at most 6; tgt and memory
// required):
//   {tgt, memory, tgt_mask, memory_mask, tgt_key_padding_mask, memory_key_padding_mask}
class TransformerDecoderLayer : public Module {
 public:
  TransformerDecoderLayer(int64_t d_model, int64_t nhead, TransformerLayerOptions options = {});
  TransformerDecoderLayer(int64_t d_model, int64_t nhead, int64_t dim_feedforward, double dropout = 0.1,
                          Activation activation = Activation::relu, double layer_norm_eps = 1e-5,
                          bool batch_first = false, bool norm_first = false);

  Tensor forward_inputs(const TensorList& inputs) override;
  size_t max_inputs() const override { return 6; }
  std::string extra_repr() const override;

  int64_t d_model;
  TransformerLayerOptions options;
  std::shared_ptr<MultiheadAttention> self_attn, multihead_attn;
  std::shared_ptr<Linear> linear1;
  std::shared_ptr<Dropout> dropout;
  std::shared_ptr<Linear> linear2;
  std::shared_ptr<LayerNorm> norm1, norm2, norm3;
  std::shared_ptr<Dropout> dropout1, dropout2, dropout3;
};

}  // namespace tandem::nn
