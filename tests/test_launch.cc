// The launcher: `hetra launch`'s arguments and mpirun command line, local jobs run for real (each
// rank's environment object, exit codes, a failed rank, a rank killed by a signal, SIGTERM passed
// on, no orphans when the launcher is killed, a stopped hetra rank found by its heartbeat), and a
// real mpirun on this host when Open MPI is installed. The rank environment of each launcher
// flavour: test_rank_environment.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "launch_testing.h"
#include "process_testing.h"

#include "common/errors.h"
#include "launch/local_job.h"
#include "launch/supervision.h"
#include "launch_command.h"

namespace {

namespace fs = std::filesystem;
using namespace hetra;
using namespace hetra::cli;
using namespace hetra::launch;
using Steady = std::chrono::steady_clock;

const std::string kHetra = HETRA_BINARY;

using hetra::test::configError;
using hetra::test::contains;

TEST(LaunchArguments, HostListsAndHostfiles) {
  const auto hosts = parseHostList("a:2,b,node-3.example:13");
  ASSERT_EQ(hosts.size(), 3u);
  EXPECT_EQ(hosts[0].host, "a");
  EXPECT_EQ(hosts[0].slots, 2);
  EXPECT_EQ(hosts[1].host, "b");
  EXPECT_EQ(hosts[1].slots, 1);
  EXPECT_EQ(hosts[2].host, "node-3.example");
  EXPECT_EQ(hosts[2].slots, 13);
  for (const std::string bad : {"a:0", "a:x", "a,,b", ":2", ""})
    EXPECT_FALSE(configError([&] { parseHostList(bad); }).empty()) << bad;

  const auto file = parseHostfile(
      "# the cluster\n\nh0 slots=3\nh1   slots=1 max_slots=4  # comment\n  h2\n", "hosts.txt");
  ASSERT_EQ(file.size(), 3u);
  EXPECT_EQ(file[0].host, "h0");
  EXPECT_EQ(file[0].slots, 3);
  EXPECT_EQ(file[1].slots, 1);
  EXPECT_EQ(file[2].host, "h2");
  EXPECT_EQ(file[2].slots, 1);
  EXPECT_TRUE(contains(configError([] { parseHostfile("h0 slots=2\nh1 cpus=4\n", "f"); }),
                       "f:2: 'cpus=4'"));
  EXPECT_TRUE(contains(configError([] { parseHostfile("# nothing\n", "f"); }), "f names no host"));
}

TEST(LaunchArguments, MpirunSpellings) {
  auto o = parseLaunchArguments({"-np", "3", "--", "prog", "-np", "9"});
  EXPECT_EQ(o.np, 3);
  EXPECT_TRUE(o.hosts.empty());
  EXPECT_EQ(o.program, (std::vector<std::string>{"prog", "-np", "9"}));
  o = parseLaunchArguments({"-n", "2", "sh", "-c", "x"});
  EXPECT_EQ(o.np, 2);
  EXPECT_EQ(o.program, (std::vector<std::string>{"sh", "-c", "x"}));
  o = parseLaunchArguments(
      {"-H", "a:2,b:3", "--mpi-arg=--allow-run-as-root", "--grace", "0.5", "--dry-run", "p"});
  EXPECT_EQ(o.np, 5);  // the slots
  EXPECT_EQ(o.hosts.size(), 2u);
  EXPECT_TRUE(o.dryRun);
  EXPECT_DOUBLE_EQ(o.graceS, 0.5);
  EXPECT_EQ(o.mpiArgs, (std::vector<std::string>{"--allow-run-as-root"}));

  const auto dir = fs::temp_directory_path() / ("hetra-launch-args-" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "hosts") << "x slots=2\ny slots=2\n";
  o = parseLaunchArguments({"--np=3", "--hostfile", (dir / "hosts").string(), "p"});
  EXPECT_EQ(o.np, 3);
  EXPECT_EQ(o.hosts.size(), 2u);
  fs::remove_all(dir);

  EXPECT_TRUE(contains(configError([] {
                         parseLaunchArguments({"-np", "5", "-H", "a:2", "p"});
                       }),
                       "--oversubscribe"));
  EXPECT_EQ(parseLaunchArguments({"-np", "5", "-H", "a:2", "--oversubscribe", "p"}).np, 5);
  EXPECT_TRUE(contains(configError([] { parseLaunchArguments({"-np", "2"}); }), "no program"));
  EXPECT_TRUE(contains(configError([] { parseLaunchArguments({"prog"}); }), "-np N is required"));
  EXPECT_TRUE(contains(configError([] { parseLaunchArguments({"-np", "0", "p"}); }), "-np 0"));
  EXPECT_TRUE(contains(configError([] { parseLaunchArguments({"--nope", "p"}); }), "'--nope'"));
  EXPECT_TRUE(contains(configError([] { parseLaunchArguments({"-np"}); }), "-np needs a value"));
}

TEST(LaunchArguments, SlowdownsOnePerRank) {
  EXPECT_EQ(parseLaunchArguments({"-np", "3", "--slowdowns", "1,2,4", "p"}).slowdowns, "1,2,4");
  EXPECT_EQ(parseLaunchArguments({"-H", "a:2", "--slowdowns=1,1.5", "p"}).slowdowns, "1,1.5");
  EXPECT_TRUE(contains(configError([] {
                         parseLaunchArguments({"-np", "3", "--slowdowns", "1,2", "p"});
                       }),
                       "--slowdowns 1,2: 2 factors for -np 3"));
  EXPECT_TRUE(contains(configError([] {
                         parseLaunchArguments({"-np", "2", "--slowdowns", "1,0.5", "p"});
                       }),
                       "'0.5' is not a factor from 1 to 1e6"));
  EXPECT_TRUE(contains(configError([] {
                         parseLaunchArguments({"-np", "2", "--slowdowns", "1,,2", "p"});
                       }),
                       "'' is not a factor"));
}

TEST(LaunchArguments, MpirunCommandLine) {
  // Each rank's torchrun variables, from Open MPI's, in front of the program.
  constexpr const char* kTorchrun =
      "export RANK=$OMPI_COMM_WORLD_RANK WORLD_SIZE=$OMPI_COMM_WORLD_SIZE "
      "LOCAL_RANK=$OMPI_COMM_WORLD_LOCAL_RANK LOCAL_WORLD_SIZE=$OMPI_COMM_WORLD_LOCAL_SIZE; "
      "exec \"$@\"";
  auto o = parseLaunchArguments({"-H", "a:2,b:1", "--mpi-arg", "--tag-output", "bench", "x y"});
  const std::map<std::string, std::string> env = {{"HETRA_STORE", "10.0.0.1:77"},
                                                  {"HETRA_JOB_ID", "j"}};
  const std::vector<std::string> expected = {
      "mpirun",       "-np",  "3",           "-H",      "a:2,b:1",
      "--map-by",     "slot", "--bind-to",   "none",    "-x",
      "HETRA_JOB_ID", "-x",   "HETRA_STORE", "-x",      "HETRA_JOB_SECRET",
      "--tag-output", "sh",   "-c",          kTorchrun, "hetra-rank",
      "bench",        "x y"};
  EXPECT_EQ(mpirunCommand(o, env), expected);
  EXPECT_EQ(
      shellCommand(env, mpirunCommand(o, env)),
      "HETRA_JOB_ID=j HETRA_STORE=10.0.0.1:77 mpirun -np 3 -H a:2,b:1 --map-by slot "
      "--bind-to none -x HETRA_JOB_ID -x HETRA_STORE -x HETRA_JOB_SECRET --tag-output sh -c '" +
          std::string(kTorchrun) + "' hetra-rank bench 'x y'");
  o = parseLaunchArguments({"-np", "4", "-H", "a:3", "--oversubscribe", "--map-by", "node",
                            "--mpirun", "/opt/ompi/bin/mpirun", "--bind-to", "core", "p"});
  const auto argv = mpirunCommand(o, {});
  EXPECT_EQ(argv, (std::vector<std::string>{"/opt/ompi/bin/mpirun", "-np", "4", "-H", "a:3",
                                            "--map-by", "node", "--bind-to", "core",
                                            "--oversubscribe", "-x", "HETRA_JOB_SECRET", "sh", "-c",
                                            kTorchrun, "hetra-rank", "p"}));
  EXPECT_EQ(shellCommand({{"A", "it's"}}, {"echo", ""}), "A='it'\\''s' echo ''");
}

// ---- real processes ----

fs::path tempDir(const std::string& name) {
  fs::path dir =
      fs::temp_directory_path() / ("hetra-launch-" + name + "-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string readText(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

double secondsSince(Steady::time_point start) {
  return std::chrono::duration<double>(Steady::now() - start).count();
}

// The launcher's own value of `name` ("<unset>" when it has none).
std::string ownVariable(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "<unset>";
}

TEST(LocalJob, EveryRankGetsItsEnvironment) {
  const auto dir = tempDir("env");
  const std::vector<const char*> settings = {"HETRA_JOB_SECRET", "HETRA_RANK_CHANNELS",
                                             "HETRA_STORE", "HETRA_RANK", "EXTRA_FOR_TEST"};
  std::vector<std::string> before;
  for (const char* name : settings) before.push_back(ownVariable(name));
  LocalJob job;
  job.np = 5;
  job.argv = {"sh", "-c",
              "echo \"$HETRA_RANK $HETRA_WORLD_SIZE $HETRA_LOCAL_RANK $HETRA_STORE_EXTERNAL "
              "$HETRA_STORE $HETRA_JOB_ID $EXTRA_FOR_TEST ${#HETRA_JOB_SECRET} "
              "$HETRA_RANK_CHANNELS\" > " +
                  dir.string() + "/$HETRA_RANK"};
  job.environment["EXTRA_FOR_TEST"] = "x";
  ASSERT_EQ(runLocalJob(job).code, 0);
  std::set<std::string> stores, channels;
  for (int r = 0; r < 5; ++r) {
    std::istringstream line(readText(dir / std::to_string(r)));
    int rank = -1, size = -1, local = -1, external = -1;
    size_t secretLength = 0;
    std::string store, job, extra, channel;
    line >> rank >> size >> local >> external >> store >> job >> extra >> secretLength >> channel;
    EXPECT_EQ(rank, r);
    EXPECT_EQ(size, 5);
    EXPECT_EQ(local, r);
    EXPECT_EQ(external, 1);
    EXPECT_TRUE(store.rfind("127.0.0.1:", 0) == 0) << store;
    EXPECT_TRUE(job.rfind("job-", 0) == 0) << job;
    EXPECT_EQ(extra, "x");
    EXPECT_GE(secretLength, 32u);  // the job's secret, as hex
    EXPECT_FALSE(channel.empty());
    stores.insert(store + " " + job);
    channels.insert(channel);
  }
  EXPECT_EQ(stores.size(), 1u);    // one store and job id for all
  EXPECT_EQ(channels.size(), 5u);  // a heartbeat channel of its own for each rank
  // The settings travelled in the ranks' environment objects: the launcher's is as it was.
  for (size_t i = 0; i < settings.size(); ++i)
    EXPECT_EQ(ownVariable(settings[i]), before[i]) << settings[i];
  fs::remove_all(dir);
}

TEST(LocalJob, AFailedRankStopsTheOthersAndGivesItsCode) {
  LocalJob job;
  job.np = 3;
  job.argv = {"sh", "-c", "if [ $HETRA_RANK = 1 ]; then exit 7; fi; exec sleep 30"};
  job.failureGrace = Millis(300);
  testing::internal::CaptureStderr();
  const auto start = Steady::now();
  const int code = runLocalJob(job).code;
  const double took = secondsSince(start);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(code, 7);
  EXPECT_LT(took, 10.0);  // the sleepers were killed, not waited for
  EXPECT_TRUE(contains(err, "rank 1 (pid ")) << err;
  EXPECT_TRUE(contains(err, "exited with status 7")) << err;
  EXPECT_FALSE(contains(err, "rank 0 (pid")) << err;  // killed by the launcher: not a failure
}

TEST(LocalJob, ARankKilledByASignal) {
  LocalJob job;
  job.np = 2;
  job.argv = {"sh", "-c", "if [ $HETRA_RANK = 1 ]; then kill -USR1 $$; fi; exec sleep 30"};
  job.failureGrace = Millis(200);
  testing::internal::CaptureStderr();
  const int code = runLocalJob(job).code;
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(code, 128 + SIGUSR1);
  EXPECT_TRUE(contains(err, "rank 1 (pid ")) << err;
  EXPECT_TRUE(contains(err, str("was killed by signal ", SIGUSR1))) << err;
}

TEST(LocalJob, TheRankThatEndedFirstIsTheFailureEvenWhenItsPipesOutliveIt) {
  // Rank 1 leaves a process of another session holding its pipes (the launcher does not kill it
  // with rank 1's process group), then is killed; ranks 0 and 2 fail a second later, as ranks
  // that report a dead peer do. Rank 1's pipes reach end of file only after theirs: the launcher's
  // reaping says that it ended first.
  LocalJob job;
  job.np = 3;
  job.argv = {"sh", "-c",
              "if [ $HETRA_RANK = 1 ]; then setsid sleep 4 & sleep 0.2; kill -KILL $$; fi; "
              "sleep 1; exit 1"};
  job.failureGrace = Millis(3000);
  testing::internal::CaptureStderr();
  const LocalJobEnd end = runLocalJob(job);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(end.code, 128 + SIGKILL) << err;
  EXPECT_EQ(end.failure.rank, 1) << end.failure.how << "\n" << err;
  EXPECT_TRUE(contains(end.failure.how, "ended without reporting why")) << end.failure.how;
}

// Three ranks (bash): rank 2 says on its heartbeat channel that it ends with status 1, reporting a
// peer's failure (`bye` "bye-peer", as a rank that caught PeerAbortedError does) or an error of its
// own ("bye"), and exits; rank 1, with `rank1Dies`, is killed a second later, as a killed rank
// whose last threads are slow to exit ends; the others run on until the launcher kills them after
// `grace`. Returns how the job ended; `err` gets the launcher's stderr.
LocalJobEnd rank2SaysThen(const std::string& bye, bool rank1Dies, Millis grace, std::string& err) {
  LocalJob job;
  job.np = 3;
  job.argv = {"bash", "-c",
              "if [ $HETRA_RANK = 2 ]; then "
              "IFS=';,' read -r interval err beat <<< \"$HETRA_RANK_CHANNELS\"; "
              "echo \"hello $$ here\" >&$beat; echo \"" +
                  bye + " 1 rank 1 (pid 0) died\" >&$beat; exit 1; fi; " +
                  (rank1Dies ? "if [ $HETRA_RANK = 1 ]; then sleep 1; kill -KILL $$; fi; " : "") +
                  "sleep 30"};
  job.failureGrace = grace;
  testing::internal::CaptureStderr();
  const LocalJobEnd end = runLocalJob(job);
  err = testing::internal::GetCapturedStderr();
  return end;
}

TEST(LocalJob, ARankThatReportsAPeersFailureIsNotBlamedForItEvenWhenItEndedFirst) {
  // Rank 0 is still running when the launcher kills the rest: stopped, not failed.
  std::string err;
  const LocalJobEnd end = rank2SaysThen("bye-peer", /*rank1Dies=*/true, Millis(3000), err);
  EXPECT_EQ(end.failure.rank, 1) << end.failure.how << "\n" << err;
  EXPECT_TRUE(contains(end.failure.how, "ended without reporting why")) << end.failure.how;
}

TEST(LocalJob, ARankThatReportsAnErrorOfItsOwnFirstIsTheFailure) {
  std::string err;
  const LocalJobEnd end = rank2SaysThen("bye", /*rank1Dies=*/true, Millis(3000), err);
  EXPECT_EQ(end.failure.rank, 2) << end.failure.how << "\n" << err;
  EXPECT_TRUE(contains(end.failure.how, "exited with status 1: rank 1 (pid 0) died"))
      << end.failure.how;
}

TEST(LocalJob, RanksTheLauncherKillsAfterTheGraceAreNotTheFailure) {
  // Only rank 2 reports a failure (of a rank elsewhere): it is the failure this launcher saw.
  std::string err;
  const LocalJobEnd end = rank2SaysThen("bye-peer", /*rank1Dies=*/false, Millis(300), err);
  EXPECT_EQ(end.code, 1) << err;
  EXPECT_EQ(end.failure.rank, 2) << end.failure.how << "\n" << err;
}

TEST(LocalJob, AMissingProgramIsRefusedBeforeStarting) {
  LocalJob job;
  job.np = 2;
  job.argv = {"no-such-program-hetra"};
  EXPECT_TRUE(contains(configError([&] { runLocalJob(job); }), "'no-such-program-hetra'"));
}

struct Started {
  pid_t pid = -1;
  fs::path output;
};

// Starts `argv` with stdout and stderr to `output`.
Started start(const std::vector<std::string>& argv, const fs::path& output) {
  Started s;
  s.output = output;
  s.pid = fork();
  if (s.pid == 0) {
    std::freopen(output.c_str(), "w", stdout);
    dup2(fileno(stdout), STDERR_FILENO);
    std::vector<char*> args;
    for (const auto& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  return s;
}

// Waits for `pid` at most `timeout`, then kills it. Returns its exit code (-1 when it had to be
// killed).
int waitFor(pid_t pid, std::chrono::milliseconds timeout) {
  const auto deadline = Steady::now() + timeout;
  int status = 0;
  while (Steady::now() < deadline) {
    if (waitpid(pid, &status, WNOHANG) == pid) return exitCodeOf(status);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return -1;
}

bool waitUntil(const std::function<bool()>& done, std::chrono::milliseconds timeout) {
  const auto deadline = Steady::now() + timeout;
  while (Steady::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return done();
}

size_t count(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

bool gone(pid_t pid) {  // no such process, or a zombie nobody reaped yet
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string pidText, comm, state;
  if (!(stat >> pidText >> comm >> state)) return true;
  return state == "Z" || state == "X";
}

TEST(LaunchCommand, RunsLocalRanksAndReportsAFailure) {
  const auto dir = tempDir("cmd");
  auto s = start({kHetra, "launch", "-np", "3", "--", "/bin/sh", "-c", "echo rank=$HETRA_RANK"},
                 dir / "ok.txt");
  EXPECT_EQ(waitFor(s.pid, std::chrono::seconds(20)), 0);
  const auto ok = readText(s.output);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(count(ok, "rank=" + std::to_string(r) + "\n"), 1u) << ok;

  // The failure message names the rank, its host and status, and ends with its last stderr lines.
  s = start({kHetra, "launch", "-np", "3", "--grace", "0.2", "sh", "-c",
             "echo \"rank $HETRA_RANK up\" >&2; [ $HETRA_RANK = 2 ] && { echo 'disk full' >&2; "
             "exit 3; }; exec sleep 30"},
            dir / "fail.txt");
  EXPECT_EQ(waitFor(s.pid, std::chrono::seconds(20)), 3);
  const auto fail = readText(s.output);
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  EXPECT_TRUE(contains(fail, str("rank 2 (pid "))) << fail;
  EXPECT_TRUE(contains(fail, str(", host ", host, ") exited with status 3"))) << fail;
  EXPECT_TRUE(contains(fail, "its last 2 lines on stderr:\n    rank 2 up\n    disk full")) << fail;
  EXPECT_EQ(count(fail, "rank 0 up\n"), 1u) << "every rank's stderr is forwarded once: " << fail;

  s = start({kHetra, "launch", "-np", "2", "--bad-option", "sh"}, dir / "bad.txt");
  EXPECT_EQ(waitFor(s.pid, std::chrono::seconds(20)), 2);
  EXPECT_TRUE(contains(readText(s.output), "'--bad-option'"));
  fs::remove_all(dir);
}

TEST(LaunchCommand, SigtermReachesEveryRank) {
  const auto dir = tempDir("term");
  const std::string script =
      "trap 'echo term-$HETRA_RANK; exit 0' TERM; echo ready-$HETRA_RANK; "
      "while :; do sleep 0.05; done";
  auto s = start({kHetra, "launch", "-np", "3", "sh", "-c", script}, dir / "out.txt");
  ASSERT_TRUE(
      waitUntil([&] { return count(readText(s.output), "ready-") == 3; }, std::chrono::seconds(20)))
      << readText(s.output);
  kill(s.pid, SIGTERM);
  EXPECT_EQ(waitFor(s.pid, std::chrono::seconds(20)), 128 + SIGTERM);
  const auto out = readText(s.output);
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(contains(out, "term-" + std::to_string(r))) << out;
  fs::remove_all(dir);
}

TEST(LaunchCommand, NoOrphansWhenTheLauncherIsKilled) {
  const auto dir = tempDir("orphans");
  auto s = start({kHetra, "launch", "-np", "3", "sh", "-c",
                  "echo $$ > " + dir.string() + "/pid-$HETRA_RANK; exec sleep 60"},
                 dir / "out.txt");
  std::vector<pid_t> ranks;
  ASSERT_TRUE(waitUntil(
      [&] {
        ranks.clear();
        for (int r = 0; r < 3; ++r) {
          std::ifstream in(dir / ("pid-" + std::to_string(r)));
          pid_t pid = 0;
          if (in >> pid) ranks.push_back(pid);
        }
        return ranks.size() == 3;
      },
      std::chrono::seconds(20)));
  for (pid_t pid : ranks) EXPECT_FALSE(gone(pid));
  kill(s.pid, SIGKILL);
  waitFor(s.pid, std::chrono::seconds(5));
  EXPECT_TRUE(waitUntil(
      [&] {
        for (pid_t pid : ranks)
          if (!gone(pid)) return false;
        return true;
      },
      std::chrono::seconds(5)));
  fs::remove_all(dir);
}

TEST(LaunchCommand, AStoppedHetraRankEndsTheJobNamingIt) {
  // A rank linked with hetra beats to hetra launch; a stopped one (SIGSTOP: a frozen VM, a
  // debugger) is found when it misses its heartbeats for HETRA_HANG_TIMEOUT_S (5 s) and killed, so
  // that its peer fails at once, instead of at the end of the peer's operation deadline (60 s).
  const auto dir = tempDir("stopped");
  auto s = start({kHetra, "launch", "-np", "2", "--", kHetra, "bench", "allreduce", "-b", "1M",
                  "-e", "1M", "-w", "0", "-n", "1000000", "--timeout-ms", "60000"},
                 dir / "out.txt");
  // Rank 0 prints the header once both ranks have joined the group, so each has said hello to
  // the launcher by then (a rank stopped before its hello is no rank linked with hetra to it).
  ASSERT_TRUE(waitUntil([&] { return contains(readText(s.output), "# hetra bench allreduce"); },
                        std::chrono::seconds(60)))
      << readText(s.output);
  const pid_t rank1 = hetra::test::rankProcesses(s.pid, 2)[1];
  ASSERT_GT(rank1, 0) << readText(s.output);
  ASSERT_EQ(kill(rank1, SIGSTOP), 0);
  const auto stopped = Steady::now();
  const int code = waitFor(s.pid, std::chrono::seconds(120));
  const double took = secondsSince(stopped);
  const auto out = readText(s.output);
  EXPECT_NE(code, 0) << out;
  EXPECT_NE(code, -1) << "the launcher had to be killed: " << out;
  EXPECT_LT(took, 30.0) << "found by the comm deadline, not the heartbeat: " << out;
  EXPECT_TRUE(contains(out, str("rank 1 (pid ", rank1, ", host "))) << out;
  EXPECT_TRUE(contains(out, "hung: no heartbeat for")) << out;
  EXPECT_TRUE(contains(out, "T (stopped)")) << out;
  fs::remove_all(dir);
}

// Open MPI is in the bench packages (scripts/install-deps.sh bench); without it this test skips.
bool haveMpirun() {
  return std::system("mpirun --version >/dev/null 2>&1") == 0;
}

std::vector<std::string> mpirunOnThisHost(int np) {
  std::vector<std::string> argv = {
      kHetra, "launch", "-np", std::to_string(np), "-H", "localhost:" + std::to_string(np)};
  if (geteuid() == 0) argv.push_back("--mpi-arg=--allow-run-as-root");
  return argv;
}

TEST(LaunchCommand, MpirunOnThisHost) {
  if (!haveMpirun()) GTEST_SKIP() << "mpirun is not installed (scripts/install-deps.sh bench)";
  const auto dir = tempDir("mpirun");
  auto argv = mpirunOnThisHost(3);
  argv.insert(argv.end(), {"--dry-run", "prog"});
  auto s = start(argv, dir / "dry.txt");
  EXPECT_EQ(waitFor(s.pid, std::chrono::seconds(20)), 0);
  const auto dry = readText(s.output);
  EXPECT_TRUE(contains(dry, "HETRA_STORE='127.0.0.1:<port>'")) << dry;
  EXPECT_TRUE(contains(dry, "mpirun -np 3 -H localhost:3 --map-by slot")) << dry;

  // Each rank sees its Open MPI rank and the store this launcher serves.
  argv = mpirunOnThisHost(3);
  argv.insert(argv.end(), {"sh", "-c",
                           "echo ompi=$OMPI_COMM_WORLD_RANK/$OMPI_COMM_WORLD_SIZE "
                           "local=$OMPI_COMM_WORLD_LOCAL_RANK store=$HETRA_STORE_EXTERNAL"});
  s = start(argv, dir / "ranks.txt");
  EXPECT_EQ(waitFor(s.pid, std::chrono::seconds(60)), 0) << readText(s.output);
  const auto ranks = readText(s.output);
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(count(ranks, str("ompi=", r, "/3 local=", r, " store=1")), 1u) << ranks;

  // ... and torchrun's variables for the same rank, torch's store on the first host at the
  // launcher's MASTER_PORT (torchrun's 29500 without one).
  argv = mpirunOnThisHost(3);
  argv.insert(argv.end(), {"sh", "-c",
                           "echo torch=$RANK/$WORLD_SIZE local=$LOCAL_RANK/$LOCAL_WORLD_SIZE "
                           "master=$MASTER_ADDR:$MASTER_PORT"});
  s = start(argv, dir / "torchrun.txt");
  EXPECT_EQ(waitFor(s.pid, std::chrono::seconds(60)), 0) << readText(s.output);
  const auto torchrun = readText(s.output);
  const char* launcherTorchPort = std::getenv("MASTER_PORT");
  const std::string torchPort = launcherTorchPort ? launcherTorchPort : "29500";
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(count(torchrun, str("torch=", r, "/3 local=", r, "/3 master=localhost:", torchPort)),
              1u)
        << torchrun;

  // hetra itself under mpirun: the ranks come from OMPI_COMM_WORLD_*, the store from -x.
  argv = mpirunOnThisHost(3);
  argv.insert(argv.end(), {kHetra, "bench", "allreduce", "--transport", "tcp", "-b", "8", "-e",
                           "40K", "-f", "9", "-w", "1", "-n", "2", "-c", "1"});
  s = start(argv, dir / "bench.txt");
  EXPECT_EQ(waitFor(s.pid, std::chrono::seconds(90)), 0) << readText(s.output);
  const auto bench = readText(s.output);
  EXPECT_TRUE(contains(bench, "3 ranks, transport tcp")) << bench;
  EXPECT_TRUE(contains(bench, "Out of bounds values : 0 OK")) << bench;

  // Plain mpirun, no hetra launcher: the store from MASTER_ADDR/MASTER_PORT (at MASTER_PORT + 1,
  // MASTER_PORT being torch's), served by rank 0.
  const std::string port = std::to_string(20000 + getpid() % 20000);
  const std::string plain =
      "MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port + " mpirun -np 3 --oversubscribe " +
      (geteuid() == 0 ? "--allow-run-as-root " : "") + "-x MASTER_ADDR -x MASTER_PORT " + kHetra +
      " bench allreduce --transport tcp -b 8 -e 8K -f 32 -w 1 -n 2 -c 1 > " +
      (dir / "plain.txt").string() + " 2>&1";
  EXPECT_EQ(std::system(("timeout 60 sh -c '" + plain + "'").c_str()), 0)
      << readText(dir / "plain.txt");
  EXPECT_TRUE(contains(readText(dir / "plain.txt"), "3 ranks, transport tcp"))
      << readText(dir / "plain.txt");

  // A failing rank's code comes back through mpirun.
  argv = mpirunOnThisHost(2);
  argv.insert(argv.end(), {"sh", "-c", "[ $OMPI_COMM_WORLD_RANK = 1 ] && exit 5; exit 0"});
  s = start(argv, dir / "fail.txt");
  const int code = waitFor(s.pid, std::chrono::seconds(60));
  EXPECT_EQ(code, 5) << readText(s.output);  // Open MPI reports the first failed rank's code
  fs::remove_all(dir);
}

}  // namespace
