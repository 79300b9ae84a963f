// The nn layer in one include: modules, layers, attention and transformer layers, losses, init,
// optimizers, safetensors, gradient clipping.
#pragma once

#include "nn/init.h"
#include "nn/layers.h"
#include "nn/loss.h"
#include "nn/module.h"
#include "nn/lr_scheduler.h"
#include "nn/optim.h"
#include "nn/optim_in_backward.h"
#include "nn/safetensors.h"
#include "nn/transformer.h"
#include "nn/utils.h"
