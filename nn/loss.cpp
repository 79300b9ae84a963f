#include "nn/loss.h"

#include "autograd/detail/loss_grad.h"
#include "autograd/ops.h"
#include "core/detail/index.h"

namespace tandem::nn {

namespace {

// Losses work on rows of classes: [N, C, d1, ...] moves C last and flattens to [M, C] with the
// targets flattened to [M]; `out_shape` is what reduction none returns.
struct Rows {
  Tensor input;   // [M, C]
  Tensor target;  // [M], i64
  Shape out_shape;
};

Rows to_rows(const Tensor& input, const Tensor& target, const char* op) {
  TANDEM_CHECK(input.defined() && target.defined(), "[{}] undefined input or target", op);
  TANDEM_CHECK(input.is_floating_point(), "[{}] expected a floating input, got {}", op, input.dtype());
  TANDEM_CHECK(target.dtype() == i64 || target.dtype() == i32,
               "[{}] expected integer class indices (i64) as target, got {}", op, target.dtype());
  TANDEM_CHECK(input.dim() >= 1, "[{}] expected input of shape [N, C] or [N, C, d...], got a 0-dim tensor", op);
  Rows rows;
  if (input.dim() == 1) {
    TANDEM_CHECK(target.dim() == 0, "[{}] an unbatched input of shape {} needs a 0-dim target, got shape {}", op,
                 input.shape(), target.shape());
    rows.input = input.unsqueeze(0);
    rows.target = target.reshape({1});
    rows.out_shape = Shape{};
  } else {
    Shape expected{input.size(0)};
    for (int64_t d = 2; d < input.dim(); ++d) expected.push_back(input.size(d));
    TANDEM_CHECK(target.shape() == expected, "[{}] input of shape {} needs a target of shape {}, got {}", op,
                 input.shape(), expected, target.shape());
    const int64_t classes = input.size(1);
    if (input.dim() == 2) {
      rows.input = input;
    } else {
      Shape perm{0};
      for (int64_t d = 2; d < input.dim(); ++d) perm.push_back(d);
      perm.push_back(1);
      rows.input = input.permute(perm).reshape({-1, classes});
    }
    rows.target = target.reshape({-1});
    rows.out_shape = target.shape();
  }
  rows.target = to_dtype(rows.target, i64);
  return rows;
}

// Every target a class or ignore_index: "[op] target 7 is out of bounds for 5 classes (expected 0..4
// or ignore_index -100)". On the CPU it throws here; on a device a kernel checks (no host sync) and
// the error is raised at the next synchronisation (cuda/runtime.h), while the ops that follow skip
// the bad rows' out-of-range reads.
void check_target_range(const Tensor& target, int64_t classes, int64_t ignore_index, const char* op) {
  detail::check_index_range(target, detail::IndexCheck::for_classes(op, classes, ignore_index));
}

Tensor class_weights(const Tensor& weight, int64_t classes, Dtype dtype, const char* op) {
  TANDEM_CHECK(weight.dim() == 1 && weight.size(0) == classes,
               "[{}] weight must have shape [{}] (one per class), got {}", op, classes, weight.shape());
  TANDEM_CHECK(weight.is_floating_point(), "[{}] weight must be floating, got {}", op, weight.dtype());
  return to_dtype(weight, dtype);
}

Tensor reduce(const Tensor& losses, Reduction reduction, const Shape& out_shape) {
  switch (reduction) {
    case Reduction::none: return losses.reshape(out_shape);
    case Reduction::sum: return sum(losses);
    case Reduction::mean: return mean(losses);
  }
  fail("[loss] unknown reduction");
}

// loss_sum / total, the mean reduction over the targets' total weight. A total of 0 (every target
// ignored, or all of class weight 0) gives 0 / 0 = NaN, as in PyTorch, but no gradient: no row
// reaches the loss, and differentiating the division would spread 1 / 0 = inf to every row,
// where the rows' weight of 0 turns it into NaN.
Tensor mean_over_total(const Tensor& loss_sum, const Tensor& total) {
  Tensor empty = eq(total, Scalar(0.0));
  Tensor ratio = div(loss_sum, masked_fill(total, empty, Scalar(1.0)));
  return where(empty, div(loss_sum.detach(), total.detach()), ratio);
}

// Class-index targets on a device: one fused kernel each way (autograd/detail/loss_grad.h; core/detail/nn_ops.h
// gives the formula, the one the composed CPU path below computes) instead of log_softmax, gather
// and masked sums. The forward kernel checks the targets itself (as check_target_range words it)
// and the mean divides by the device-side sum of the kept rows' weights: no host sync.
Tensor fused_cross_entropy(const Tensor& logits, const Tensor& target, const CrossEntropyOptions& options) {
  Rows rows = to_rows(logits, target, "cross_entropy");
  const int64_t classes = rows.input.size(1);
  Tensor weight = options.weight.defined()
                      ? class_weights(options.weight, classes, rows.input.dtype(), "cross_entropy").detach()
                      : Tensor();
  auto [loss, kept] =
      autograd::cross_entropy_rows(rows.input, rows.target, weight, options.ignore_index, options.label_smoothing);
  switch (options.reduction) {
    case Reduction::none: return loss.reshape(rows.out_shape);
    case Reduction::sum: return sum(loss);
    case Reduction::mean: return mean_over_total(sum(loss), sum(kept));
  }
  fail("[cross_entropy] unknown reduction");
}

}  // namespace

Tensor nll_loss(const Tensor& input, const Tensor& target, const NLLLossOptions& options) {
  Rows rows = to_rows(input, target, "nll_loss");
  const int64_t classes = rows.input.size(1);
  check_target_range(rows.target, classes, options.ignore_index, "nll_loss");

  Tensor ignored = eq(rows.target, Scalar(options.ignore_index));
  Tensor safe_target = masked_fill(rows.target, ignored, Scalar(int64_t{0}));
  Tensor picked = gather(rows.input, 1, safe_target.unsqueeze(1)).squeeze(1);  // [M]
  // Per-row weight: 0 for ignored rows, the class weight (or 1) otherwise.
  Tensor w = to_dtype(logical_not(ignored), rows.input.dtype());
  if (options.weight.defined()) {
    w = w * index_select(class_weights(options.weight, classes, rows.input.dtype(), "nll_loss"), 0, safe_target);
  }
  Tensor losses = neg(picked) * w;
  switch (options.reduction) {
    case Reduction::none: return losses.reshape(rows.out_shape);
    case Reduction::sum: return sum(losses);
    case Reduction::mean: return mean_over_total(sum(losses), sum(w));
  }
  fail("[nll_loss] unknown reduction");
}

Tensor nll_loss(const Tensor& input, const Tensor& target, Reduction reduction, int64_t ignore_index) {
  NLLLossOptions o;
  o.reduction = reduction;
  o.ignore_index = ignore_index;
  return nll_loss(input, target, o);
}

Tensor cross_entropy(const Tensor& logits, const Tensor& target, const CrossEntropyOptions& options) {
  TANDEM_CHECK(logits.defined() && target.defined(), "[cross_entropy] undefined input or target");
  TANDEM_CHECK(logits.dim() >= 1, "[cross_entropy] expected logits of shape [N, C] or [N, C, d...], got a 0-dim tensor");
  TANDEM_CHECK(options.label_smoothing >= 0 && options.label_smoothing <= 1,
               "[cross_entropy] label_smoothing must be in [0, 1], got {}", options.label_smoothing);
  const int64_t class_dim = logits.dim() == 1 ? 0 : 1;
  const int64_t classes = logits.size(class_dim);
  const double eps = options.label_smoothing;
  const bool weight_needs_grad = options.weight.defined() && options.weight.requires_grad();
  if (!logits.is_cpu() && !target.is_floating_point() && !weight_needs_grad)
    return fused_cross_entropy(logits, target, options);
  Tensor logp = log_softmax(logits, class_dim);

  // Class probabilities as target (same shape as the logits).
  if (target.is_floating_point()) {
    TANDEM_CHECK(target.shape() == logits.shape(),
                 "[cross_entropy] probability targets must have the logits' shape {}, got {}", logits.shape(),
                 target.shape());
    Tensor probs = to_dtype(target, logp.dtype());
    if (eps > 0) probs = probs * (1.0 - eps) + eps / static_cast<double>(classes);
    Tensor terms = logp * probs;
    if (options.weight.defined()) {
      Shape wshape(static_cast<size_t>(logits.dim()), 1);
      wshape[class_dim] = classes;
      terms = terms * class_weights(options.weight, classes, logp.dtype(), "cross_entropy").view(wshape);
    }
    Tensor per = neg(sum(terms, {class_dim}));
    if (options.reduction == Reduction::mean) {
      return div(sum(per), static_cast<double>(logits.numel() / std::max<int64_t>(classes, 1)));
    }
    return reduce(per, options.reduction, per.shape());
  }

  NLLLossOptions nll_options{options.weight, options.ignore_index, options.reduction};
  Tensor nll = nll_loss(logp, target, nll_options);
  if (eps == 0) return nll;

  // Label smoothing, PyTorch's formula: the smoothing term is -sum_c w_c log p_c per row, zero
  // on ignored rows, normalised like the nll term under mean.
  Rows rows = to_rows(logp, target, "cross_entropy");
  Tensor ignored = eq(rows.target, Scalar(options.ignore_index));
  Tensor row_terms = rows.input;
  Tensor weight;
  if (options.weight.defined()) {
    weight = class_weights(options.weight, classes, logp.dtype(), "cross_entropy");
    row_terms = row_terms * weight;
  }
  Tensor smooth = masked_fill(neg(sum(row_terms, {1})), ignored, Scalar(0.0));
  Tensor smooth_reduced;
  switch (options.reduction) {
    case Reduction::none: smooth_reduced = smooth.reshape(rows.out_shape); break;
    case Reduction::sum: smooth_reduced = sum(smooth); break;
    case Reduction::mean: {
      Tensor kept = to_dtype(logical_not(ignored), logp.dtype());
      if (weight.defined()) {
        Tensor safe_target = masked_fill(rows.target, ignored, Scalar(int64_t{0}));
        kept = kept * index_select(weight, 0, safe_target);
      }
      smooth_reduced = mean_over_total(sum(smooth), sum(kept));
      break;
    }
  }
  return nll * (1.0 - eps) + smooth_reduced * (eps / static_cast<double>(classes));
}

Tensor cross_entropy(const Tensor& logits, const Tensor& target, Reduction reduction, int64_t ignore_index,
                     double label_smoothing) {
  CrossEntropyOptions o;
  o.reduction = reduction;
  o.ignore_index = ignore_index;
  o.label_smoothing = label_smoothing;
  return cross_entropy(logits, target, o);
}

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  TANDEM_CHECK(input.defined() && target.defined(), "[mse_loss] undefined input or target");
  TANDEM_CHECK(input.shape() == target.shape(),
               "[mse_loss] input and target must have the same shape, got {} and {}", input.shape(), target.shape());
  TANDEM_CHECK(input.is_floating_point(), "[mse_loss] expected a floating input, got {}", input.dtype());
  Tensor diff = input - target;
  return reduce(diff * diff, reduction, input.shape());
}

}  // namespace tandem::nn
