// The data layer: IDX files, data sets (tensors, Fashion-MNIST) and the DataLoader. It sits
// above nn and beside dist, whose DistributedSampler shards and shuffles every epoch.
#pragma once

#include "data/dataset.h"
#include "data/fashion_mnist.h"
#include "data/idx.h"
#include "data/loader.h"
