// Tandem's umbrella header: everything a user needs.
#pragma once

#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/shape.h"
#include "core/tensor.h"
#include "core/threads.h"
#include "core/parallel.h"
#include "autograd/engine.h"
#include "autograd/function.h"
#include "autograd/grad_mode.h"
#include "autograd/gradcheck.h"
#include "autograd/hooks.h"
#include "autograd/ops.h"
#include "nn/nn.h"
#include "dist/dist.h"
#include "data/data.h"
