// The data layer: IDX files, data sets (tensors, Fashion-MNIST, character-level text), the
// DistributedSampler that shards and shuffles every epoch, and the DataLoader. It sits above nn and
// beside dist, and needs nothing from it.
#pragma once

#include "data/dataset.h"
#include "data/fashion_mnist.h"
#include "data/idx.h"
#include "data/loader.h"
#include "data/sampler.h"
#include "data/text.h"
