// The launcher library (src/launch) under the names the CLI's commands use: how a hetra process
// learns its place in a job (launch/rank_environment.h) and starts local ranks
// (launch/local_job.h).
#pragma once

#include "launch/local_job.h"
#include "launch/rank_environment.h"
#include "launch/supervision.h"

namespace hetra::cli {

using launch::connectJobStore;
using launch::listenAddressFor;
using launch::onePerCore;
using launch::RankContext;
using launch::rankFromEnvironment;
using launch::spawnLocalRanks;

}  // namespace hetra::cli
