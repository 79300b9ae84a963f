// The dist layer's umbrella header: process groups and their backends, dist::init, DDP and what
// it is built from.
#pragma once

#include "dist/ddp/comm_hooks.h"
#include "dist/ddp/ddp.h"
#include "dist/init.h"
#include "dist/mpi/mpi.h"
#include "dist/process_group.h"
#include "dist/ddp/reducer.h"
#include "dist/threads/threads.h"
