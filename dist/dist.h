// The dist layer's umbrella header: process groups and their backends, dist::init, DDP with its
// options, comm hooks and statistics, Join for uneven inputs, the ZeRO-1 optimizer, checkpoints of
// a training run, the flight recorder. DDP's machinery (dist/ddp/detail/) is internal.
#pragma once

#include "dist/checkpoint.h"
#include "dist/ddp/comm_hooks.h"
#include "dist/ddp/ddp.h"
#include "dist/ddp/mixed_precision.h"
#include "dist/ddp/reducer_stats.h"
#include "dist/flight_recorder.h"
#include "dist/init.h"
#include "dist/join.h"
#include "dist/mpi/mpi.h"
#include "dist/process_group.h"
#include "dist/threads/threads.h"
#include "dist/zero.h"
