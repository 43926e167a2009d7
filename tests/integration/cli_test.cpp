// The `ferry` command: its answers to bad input (a table), its runs, a listener that serves one
// initiator after another, and failures printed by the side that can explain them.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <regex>

#include "support/cli_process.hpp"
#include "support/pair.hpp"

namespace ferry::test {
namespace {

// `ferry bench --listen ...`: its address, from the first line it prints.
std::string listening_address(Background& target) {
  std::string first = target.line();
  const std::string prefix = "listening on ";
  if (first.rfind(prefix, 0) != 0) return "";
  return first.substr(prefix.size());
}

std::string verbs_unusable_reason() {
  for (const auto& t : Engine::transports()) {
    if (t.kind == TransportKind::kVerbs && !t.usable) return t.detail;
  }
  return "";
}

// A declared transport setting's default, as `ferry bench --help` shows it.
std::string declared_default(const std::string& name) {
  for (const SettingInfo& s : Engine::settings()) {
    if (s.name == name) return s.default_value;
  }
  return "(" + name + " is not declared)";
}

struct Case {
  std::string args;
  int exit_code;
  std::string says;  // part of what it prints
};

TEST(Cli, AnswersToEveryKindOfInput) {
  std::vector<Case> cases = {
      // Sizes: --sizes, --slice, --stripe.
      {"bench --sizes 0", 2, "ferry bench: --sizes: '0' must be at least 1 byte"},
      {"bench --sizes 4K,0", 2, "--sizes: '0' must be at least 1 byte"},
      {"bench --sizes -5", 2, "--sizes: '-5' is not a size (use a number with an optional K"},
      {"bench --sizes 1.5M", 2, "--sizes: '1.5M' is not a size"},
      {"bench --sizes 4Q", 2, "--sizes: '4Q' is not a size"},
      {"bench --sizes ''", 2, "--sizes: '' is not a size"},
      {"bench --sizes 1024T", 2, "--sizes: '1024T' is larger than this host's memory ("},
      {"bench --sizes 99999999999999999999", 2, "is larger than this host's memory"},
      {"bench --sizes 1G --batch 1024 --concurrency 4", 2, "more than its memory"},
      {"bench --slice 0", 2, "--slice: '0' must be between 4K and 64M"},
      {"bench --slice 128M", 2, "--slice: '128M' must be between 4K and 64M"},
      {"bench --slice -5", 2, "--slice: '-5' is not a size"},
      {"bench --slice 1024T", 2, "--slice: '1024T' is larger than this host's memory"},
      {"bench --stripe 0", 2, "--stripe: '0' must be at least 1 byte"},
      {"bench --stripe -5", 2, "--stripe: '-5' is not a size"},
      {"bench --stripe 1024T", 2, "--stripe: '1024T' is larger than this host's memory"},
      {"bench --memory heap", 2, "--memory: 'heap': expected register or allocate"},
      // Numbers.
      {"bench --iters 0", 2, "--iters: '0' must be between 1 and "},
      {"bench --iters x", 2, "--iters: 'x' is not a whole number"},
      // Transport settings: a flag each, from the transport's declaration.
      {"bench --tcp.streams 0", 2, "--tcp.streams: tcp.streams must be 1..64 (is 0)"},
      {"bench --tcp.streams 65", 2, "--tcp.streams: tcp.streams must be 1..64 (is 65)"},
      {"bench --verbs.qps -1", 2, "--verbs.qps: verbs.qps must be 1..64 (is -1)"},
      {"bench --shm.cross_memory nope", 2, "--shm.cross_memory: shm.cross_memory: 'nope' is not"},
      {"bench --batch 0", 2, "--batch: '0' must be between 1 and "},
      {"bench --concurrency 0", 2, "--concurrency: '0' must be between 1 and "},
      {"bench --batch 200 --concurrency 100", 2, "transfers in flight; at most 16384"},
      {"bench --scatter 0", 2, "--scatter: '0' must be between 1 and "},
      {"bench --scatter 10 --op send", 2, "--scatter: only with --op write and read, not send"},
      {"bench --scatter 10 --batch 2", 2, "--scatter: runs one batch at a time"},
      {"bench --threads 0", 2, "--threads: '0' must be between 1 and 64"},
      {"bench --threads 65", 2, "--threads: '65' must be between 1 and 64"},
      {"bench --busy-poll-us -1", 2, "--busy-poll-us: '-1' must be between 0 and "},
      {"bench --wait-spin-us -1", 2, "--wait-spin-us: '-1' must be between 0 and "},
      {"bench --shm.stream_poll -1", 2, "--shm.stream_poll: shm.stream_poll must be 0..1s"},
      // Operations and transports.
      {"bench --op ''", 2, "--op: '' names no operation (use write, read"},
      {"bench --op write,,read", 2, "--op: 'write,,read' has an empty operation"},
      {"bench --op teleport", 2, "--op: unknown operation 'teleport'"},
      {"bench --transport pigeon", 2, "--transport: 'pigeon' is not one of auto, tcp, shm, verbs"},
      // Addresses.
      {"bench --listen ''", 2, "--listen: '' is not an address"},
      {"bench --listen 127.0.0.1", 2, "--listen: '127.0.0.1' has no port"},
      {"bench --listen 127.0.0.1:", 2, "--listen: '127.0.0.1:' has no port"},
      {"bench --listen 127.0.0.1:70000", 2, "port '70000' is out of range (0 to 65535)"},
      {"bench --listen ::1:5000", 2, "an IPv6 address goes in brackets"},
      {"bench --listen '[::1:5000'", 2, "--listen: '[::1:5000' has no closing ']'"},
      {"bench --listen '[]:5000'", 2, "--listen: '[]:5000' has an empty host"},
      {"bench --connect 127.0.0.1:0", 2, "port '0' is out of range (1 to 65535)"},
      {"bench --connect :5000", 2, "--connect: ':5000' has an empty host"},
      {"bench --connect localhost", 2, "--connect: 'localhost' has no port"},
      {"bench --connect '[::1]'", 2, "--connect: '[::1]' has no port"},
      {"bench --connect '[::1]5000'", 2, "has no ':' after ']'"},
      {"bench --connect fd00::2:5000", 2, "an IPv6 address goes in brackets"},
      {"bench --connect localhost:http", 2, "port 'http' is not a number"},
      {"bench --listen 127.0.0.1:0 --connect 127.0.0.1:1", 2, "excludes --connect"},
      {"bench --once", 2, "--once: only with --listen"},
      // Commands, version, help.
      {"bnech", 2, "ferry: unknown command 'bnech'; did you mean 'bench'?"},
      {"inof", 2, "did you mean 'info'?"},
      {"teleport", 2,
       "ferry: unknown command 'teleport' (commands: bench, info, emulate, stream, gauge)"},
      {"emulat", 2, "did you mean 'emulate'?"},
      // emulate and stream.
      {"emulate --rate fast", 2, "ferry emulate: --rate: 'fast' is not a rate"},
      {"emulate --rate 2XB/s", 2, "--rate: '2XB/s' is not a rate"},
      {"emulate --frame 16", 2, "--frame: '16' must be between"},
      {"emulate --jitter 2", 2, "--jitter: '2' must be between 0 and 1"},
      {"emulate --burst 0", 2, "--burst: '0' must be between 1 and"},
      {"emulate --listen out.bin", 2, "--listen: 'out.bin' is not a listening endpoint"},
      {"emulate --out discard", 2, "--out: 'discard' is no reader"},
      {"emulate --out /nonexistent/dir/x", 1,
       "ferry emulate: open /nonexistent/dir/x: No such file"},
      {"emulate --listen tcp:127.0.0.1:0 --out x", 2, "excludes"},
      {"stream", 2, "ferry stream: --listen/--connect: give --listen HOST:PORT to receive"},
      {"stream --connect 127.0.0.1:1 --sink x", 2, "--sink requires --listen"},
      {"stream --listen 127.0.0.1:0 --source gen", 2, "--source requires --connect"},
      {"stream --listen 127.0.0.1:0 --slots 1", 2, "--slots: '1' must be between 2 and 1024"},
      {"stream --listen 127.0.0.1:0 --slot-bytes 1K", 2, "--slot-bytes: '1K' must be between 4K"},
      {"stream --listen 127.0.0.1:0 --sink unix:", 2, "--sink: 'unix:' names no socket path"},
      {"stream --connect 127.0.0.1:0", 2, "--connect: '127.0.0.1:0': port '0' is out of range"},
      {"stream --listen 127.0.0.1:0 --gather-us 1000001", 2,
       "--gather-us: '1000001' must be between 0 and 1000000"},
      {"stream --connect 127.0.0.1:1 --gather-us 5", 2, "--gather-us requires --listen"},
      {"stream --help", 0, "--gather-us US=10000"},
      {"gauge --web 127.0.0.1", 2, "ferry gauge: --web: '127.0.0.1' has no port"},
      {"gauge --udp localhost:x", 2, "--udp: 'localhost:x': port 'x' is not a number"},
      {"gauge --udp localhost:0", 1, "ferry gauge: --udp localhost:0: not a numeric address"},
      {"stream --listen 127.0.0.1:0 --web :", 2, "--web: ':' has no port"},
      {"stream --listen 127.0.0.1:0 --transport carrier-pigeon", 2,
       "'carrier-pigeon' is not one of auto"},
      {"--version", 0, "ferry " + std::string(Engine::version())},
      {"bench --help", 0, "--tcp.streams VALUE=" + std::to_string(Config{}.tcp.streams)},
      {"bench --help", 0, "--transport NAME=auto"},
      {"bench --help", 0, "--sizes SIZES=4K,16K,64K,256K,1M,4M,16M,64M"},
      {"bench --help", 0,
       "--wait-spin-us US=" +
           std::to_string(
               std::chrono::duration_cast<std::chrono::microseconds>(Config{}.wait_spin).count())},
      {"bench --help", 0, "--shm.stream_poll VALUE=" + declared_default("shm.stream_poll")},
  };
  std::string reason = verbs_unusable_reason();
  if (!reason.empty()) cases.push_back({"bench --transport verbs", 1, reason});
  for (const auto& c : cases) {
    std::string out;
    EXPECT_EQ(run(c.args, out), c.exit_code) << c.args << "\n" << out;
    EXPECT_NE(out.find(c.says), std::string::npos) << c.args << "\nwanted: " << c.says << "\n"
                                                   << out;
    EXPECT_EQ(out.find("listening on"), std::string::npos) << c.args << "\n" << out;
  }
}

TEST(Cli, Info) {
  std::string text;
  ASSERT_EQ(run("info", text), 0) << text;
  // Aligned columns; the guest suite greps "verbs +usable" (tests/rdma/ferry.tests).
  EXPECT_TRUE(std::regex_search(text, std::regex("\n  tcp +usable +built in"))) << text;
  EXPECT_TRUE(std::regex_search(text, std::regex("\n  verbs +(usable|unusable) "))) << text;
  // The routing decision for the default configuration, and why.
  EXPECT_TRUE(std::regex_search(
      text, std::regex("\nroutes with the default transports \\(shm, cuda_ipc, verbs, tcp\\), to a peer "
                       "configured alike:\n  peer on this host:\n    write/read +host->host +"
                       "shm +shm: chosen \\(rank 1\\); cuda_ipc: [^\n]+; verbs: [^\n]+; tcp: [^\n]+\n")))
      << text;
  EXPECT_NE(text.find("  peer on another host:\n"), std::string::npos) << text;
  std::string json;
  ASSERT_EQ(run("info --json", json), 0) << json;
  EXPECT_EQ(json.front(), '{') << json;
  EXPECT_EQ(json.substr(json.size() - 2), "}\n") << json;
  EXPECT_EQ(std::count(json.begin(), json.end(), '\n'), 1) << json;
  for (const std::string& part :
       {"{\"version\":\"" + std::string(Engine::version()) + "\",\"transports\":[{\"name\":",
        std::string("{\"name\":\"tcp\",\"usable\":true,\"detail\":"), std::string("\"devices\":["),
        std::string(
            "],\"configured\":{\"by\":\"default\",\"transports\":[\"shm\",\"cuda_ipc\",\"verbs\",\"tcp\"]},"
            "\"routes\":{\"same host\":[{\"operations\":\"write/read\",\"local\":"
            "\"host\",\"remote\":\"host\",\"transport\":\""),
        std::string("\"other host\":[{\"operations\":\"write/read\""),
        std::string("}]},\"settings\":[{\"name\":\"tcp.streams\","),
        std::string("}],\"cuda\":{\"driver\":"), std::string("]},\"interfaces\":[{\"name\":\""),
        std::string("\"address\":\"127.0.0.1\",\"up\":true}")}) {
    EXPECT_NE(json.find(part), std::string::npos) << part << "\n" << json;
  }
}

// `ferry info --identity FILE` prints what an engine with that identity file is: what a peer
// puts in its trusted_keys.
TEST(Cli, InfoPrintsTheIdentityOfAnIdentityFile) {
  ScratchPath key_file("cli-identity.pem");
  std::string text;
  ASSERT_EQ(run("info --identity " + key_file.str(), text), 0) << text;
  Config c = test_config();
  c.identity_file = key_file.str();  // the file the command created
  Engine engine(c);
  EXPECT_EQ(text, "engine id   " + std::to_string(engine.id()) + "\npublic key  " +
                      engine.public_key() + "\n");
  std::string json;
  ASSERT_EQ(run("info --json --identity " + key_file.str(), json), 0) << json;
  EXPECT_EQ(json, "{\"engine_id\":" + std::to_string(engine.id()) + ",\"public_key\":\"" +
                      engine.public_key() + "\"}\n");
  ASSERT_EQ(::chmod(key_file.str().c_str(), 0644), 0);
  EXPECT_EQ(run("info --identity " + key_file.str(), text), 1) << text;
  EXPECT_NE(text.find("accessible by group or others"), std::string::npos) << text;
}

// FERRY_TRANSPORTS reaches the command: info shows the order it sets, bench follows it unless
// --transport names one, and a bad value is refused with its name.
TEST(Cli, TheTransportsVariableOrdersWhatRuns) {
  std::string text;
  {
    ScopedEnv env(Engine::kTransportsVariable, "tcp");
    ASSERT_EQ(run("info", text), 0) << text;
    EXPECT_NE(text.find("\nroutes with the transports FERRY_TRANSPORTS names (tcp), to a peer "
                        "configured alike:\n  peer on this host:\n    write/read      host->host"
                        "  tcp  tcp: chosen (rank 1)\n"),
              std::string::npos)
        << text;
    std::string json;
    ASSERT_EQ(run("info --json", json), 0) << json;
    EXPECT_NE(json.find("\"configured\":{\"by\":\"FERRY_TRANSPORTS\",\"transports\":[\"tcp\"]}"),
              std::string::npos)
        << json;
  }
  {
    // Loopback cannot reach the bench's other process; the command line's tcp still runs.
    ScopedEnv env(Engine::kTransportsVariable, "loopback");
    std::string refused;
    EXPECT_NE(run("bench --op write --sizes 4K --iters 2", refused), 0) << refused;
    std::string out;
    ASSERT_EQ(run("bench --transport tcp --op write --sizes 4K --iters 2", out), 0) << out;
    EXPECT_NE(out.find("tcp       write "), std::string::npos) << out;
  }
  ScopedEnv env(Engine::kTransportsVariable, "tcp,nope");
  std::string bad;
  EXPECT_EQ(run("bench --op write --sizes 4K --iters 2", bad), 1) << bad;
  EXPECT_NE(bad.find("invalid_argument: FERRY_TRANSPORTS=\"tcp,nope\": unknown transport 'nope'"),
            std::string::npos)
      << bad;
}

TEST(Cli, FerryLogAndFerryLogFileSendEachProcesssLinesToTheFile) {
  std::string file = ::testing::TempDir() + "ferry-log-" + std::to_string(::getpid()) + ".log";
  std::remove(file.c_str());
  {
    ScopedEnv level("FERRY_LOG", "info");
    ScopedEnv where("FERRY_LOG_FILE", file.c_str());
    std::string out;
    ASSERT_EQ(run("bench --transport tcp --op write --sizes 4K --iters 2", out), 0) << out;
    EXPECT_EQ(out.find(" info engine: "), std::string::npos) << "logged to the file only\n" << out;
  }
  std::ifstream in(file);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::remove(file.c_str());
  // Both processes (the bench and the target it started) logged their peer's routes.
  EXPECT_TRUE(std::regex_search(
      text, std::regex("ferry \\d{4}-\\d\\d-\\d\\dT[0-9:.]+Z info engine: peer \\d+ at [^ ]+ "
                       "\\(same host, we connected\\): write/read over tcp \\(tcp: chosen")))
      << text;
  EXPECT_NE(text.find("(same host, connected to us): write/read over tcp"), std::string::npos)
      << text;
  {
    // A level that is none is said once, and the default (warn) holds.
    ScopedEnv level("FERRY_LOG", "loud");
    std::string out;
    ASSERT_EQ(run("bench --transport tcp --op write --sizes 4K --iters 2", out), 0) << out;
    EXPECT_NE(out.find(" warn log: FERRY_LOG=\"loud\" is not a level (off, error, warn, info, "
                       "debug, trace); using warn"),
              std::string::npos)
        << out;
    EXPECT_EQ(out.find(" info engine: "), std::string::npos) << out;
  }
}

TEST(Cli, TransportSettingsAreListedAndSetByName) {
  std::string info;
  {
    ScopedEnv env("FERRY_TCP_STREAMS", "5");
    ASSERT_EQ(run("info", info), 0) << info;
  }
  EXPECT_TRUE(std::regex_search(
      info, std::regex(
                "\n  tcp\\.streams = 5 +count 1\\.\\.64 +sockets per peer[^\n]*\\(default 2\\)\n")))
      << info;
  EXPECT_TRUE(
      std::regex_search(info, std::regex("\n  shm\\.stream_poll = 20us +duration 0\\.\\.1s ")))
      << info;
  std::string json;
  ASSERT_EQ(run("info --json", json), 0) << json;
  EXPECT_NE(json.find("{\"name\":\"tcp.eager_bytes\",\"type\":\"bytes\",\"value\":\"1M\","
                      "\"default\":\"1M\",\"range\":\"0..4G\",\"environment\":"
                      "\"FERRY_TCP_EAGER_BYTES\","),
            std::string::npos)
      << json;
  // --set reaches both ends: with cross-memory attach off, messages leave shm for TCP.
  std::string out;
  ASSERT_EQ(run("bench --op send --sizes 4K --iters 2 --set shm.cross_memory=0", out), 0) << out;
  EXPECT_NE(out.find("cross-memory attach is off here: Config::shm.cross_memory is false"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("tcp       send "), std::string::npos) << out;
  std::string refused;
  EXPECT_EQ(run("bench --set tcp.streams=0", refused), 2) << refused;
  EXPECT_NE(refused.find("ferry bench: --set: tcp.streams must be 1..64 (is 0)"), std::string::npos)
      << refused;
}

// A listening socket nobody should connect to.
struct Trap {
  Trap() {
    fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (bind(fd, reinterpret_cast<sockaddr*>(&a), len) != 0 || listen(fd, 8) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      throw std::runtime_error("trap socket");
    }
    address = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  }
  ~Trap() { close(fd); }
  bool connected() const {
    int c = accept(fd, nullptr, nullptr);
    if (c >= 0) close(c);
    return c >= 0;
  }
  int fd = -1;
  std::string address;
};

TEST(Cli, BadInputConnectsToNothingAndListensNowhere) {
  Trap trap;
  std::vector<std::string> bad = {"--sizes 0", "--sizes 1024T", "--iters 0",
                                  "--op ''",   "--verbs.qps 0", "--slice 0"};
  if (!verbs_unusable_reason().empty()) bad.push_back("--transport verbs");
  for (const auto& args : bad) {
    std::string out;
    EXPECT_NE(run("bench --connect " + trap.address + " " + args, out), 0) << args << "\n" << out;
    EXPECT_FALSE(trap.connected()) << args;
    std::string listener;
    EXPECT_NE(run("bench --listen 127.0.0.1:0 " + args, listener), 0) << args;
    EXPECT_EQ(listener.find("listening on"), std::string::npos) << args << "\n" << listener;
  }
}

TEST(Cli, BenchRunsEveryOperationAndVerifies) {
  std::string out;
  ASSERT_EQ(run("bench --op write,read,write_imm,send,imm_pingpong --sizes 4K,1000003 --iters 5 "
                "--batch 3 --concurrency 2 --secret k",
                out),
            0)
      << out;
  for (const char* op : {"write ", "read ", "write_imm ", "send ", "imm_pingpong "}) {
    EXPECT_NE(out.find(std::string("shm       ") + op), std::string::npos) << op << "\n" << out;
  }
  EXPECT_EQ(out.find('\r'), std::string::npos) << "progress shown off a terminal\n" << out;
  // Which transport each operation took, and why, before the table.
  EXPECT_TRUE(std::regex_search(
      out, std::regex("routes to the peer \\(same host\\):\n  write/read +host->host +shm +"
                      "shm: chosen \\(rank 1\\); cuda_ipc: [^\n]+; verbs: [^\n]+; tcp: fallback [^\n]+\n"
                      "  write_with_imm ")))
      << out;
  std::string json;
  ASSERT_EQ(run("bench --op read --sizes 64KiB --iters 3 --json", json), 0) << json;
  EXPECT_NE(json.find("\"size\":65536,"), std::string::npos) << json;
  EXPECT_NE(json.find("\"verified\":true"), std::string::npos) << json;
  EXPECT_NE(json.find("\"why\":\"shm: chosen (rank 1); "), std::string::npos) << json;
  // Batches prepared once and posted again (Peer::prepare_*), all in one area, checked the
  // same way. (Not the ping-pong: over TCP its polling of memory the receiving thread copies
  // into is a data race by design, which TSan stops; the guest suite runs it over verbs.)
  std::string prepared;
  ASSERT_EQ(run("bench --op write,read,write_imm --prepared --same-area --sizes 4096,1000003 "
                "--iters 5 --batch 3 --concurrency 2 --json",
                prepared),
            0)
      << prepared;
  EXPECT_EQ(std::count(prepared.begin(), prepared.end(), '\n'), 6) << prepared;
  EXPECT_EQ(prepared.find("\"prepared\":false"), std::string::npos) << prepared;
  EXPECT_EQ(prepared.find("\"verified\":false"), std::string::npos) << prepared;
  // Scattered batches (entries of odd sizes, larger than a slice too) beside contiguous
  // transfers, verified byte for byte; each size prints two rows and the ratio.
  std::string scattered;
  ASSERT_EQ(run("bench --op write,read --scatter 300 --sizes 1000,70000 --slice 64K --iters 3 "
                "--json",
                scattered),
            0)
      << scattered;
  EXPECT_EQ(std::count(scattered.begin(), scattered.end(), '\n'), 12) << scattered;
  EXPECT_EQ(scattered.find("\"verified\":false"), std::string::npos) << scattered;
  EXPECT_NE(scattered.find("\"scatter\":300,\"ratio\":"), std::string::npos) << scattered;
  // Memory from Engine::allocate on both sides: the target lends its region after the first
  // access and the initiator copies through the mapping; every operation still verified. (Not
  // the ping-pong, for the reason above: its first rounds land through our progress thread.)
  std::string allocated;
  ASSERT_EQ(run("bench --memory allocate --op write,read,write_imm,send --sizes 8,1000003 "
                "--iters 5 --concurrency 2 --json",
                allocated),
            0)
      << allocated;
  EXPECT_EQ(std::count(allocated.begin(), allocated.end(), '\n'), 8) << allocated;
  EXPECT_EQ(allocated.find("\"verified\":false"), std::string::npos) << allocated;
  // Mid-size writes pulled with process_vm_readv instead of riding in the rings, and writes and
  // messages streaming through the rings with nobody polling for their next piece or request
  // (messages above 2 MiB are pulled): still byte-exact.
  std::string pulled;
  ASSERT_EQ(
      run("bench --shm.ring_copies_up_to 0 --op write,write_imm,send --sizes 3000007 --iters 3 "
          "--concurrency 2 --json",
          pulled),
      0)
      << pulled;
  std::string unpolled;
  ASSERT_EQ(run("bench --shm.stream_poll 0 --shm.request_poll 0 --op write,send "
                "--sizes 1000003,3000007 --iters 3 "
                "--concurrency 2 --json",
                unpolled),
            0)
      << unpolled;
  for (const std::string* rows : {&pulled, &unpolled}) {
    EXPECT_NE(rows->find("\"verified\":true"), std::string::npos) << *rows;
    EXPECT_EQ(rows->find("\"verified\":false"), std::string::npos) << *rows;
  }
  // Without cross-memory attach: writes and reads through the rings, sends over TCP, and the
  // routes say why.
  std::string ringed;
  ASSERT_EQ(run("bench --shm.cross_memory false --op write,read,send --sizes 8,1000003 --iters 5 "
                "--concurrency 2 --json",
                ringed),
            0)
      << ringed;
  EXPECT_EQ(std::count(ringed.begin(), ringed.end(), '\n'), 6) << ringed;
  EXPECT_EQ(ringed.find("\"verified\":false"), std::string::npos) << ringed;
  EXPECT_NE(ringed.find("\"transport\":\"shm\",\"op\":\"write\""), std::string::npos) << ringed;
  EXPECT_NE(ringed.find("\"transport\":\"tcp\",\"op\":\"send\""), std::string::npos) << ringed;
  EXPECT_NE(ringed.find("shm: cannot carry send/recv here: cross-memory attach is off here: "
                        "Config::shm.cross_memory is false"),
            std::string::npos)
      << ringed;
}

TEST(Cli, ListenerServesTheNextInitiatorAfterOneIsKilled) {
  Background target({"bench", "--listen", "127.0.0.1:0"});
  std::string address = listening_address(target);
  ASSERT_FALSE(address.empty());
  {
    // Far more than it can move before it is killed: the header says the run has started.
    Background doomed(
        {"bench", "--connect", address, "--op", "write", "--sizes", "16M", "--iters", "1000000"});
    std::string header;  // after the routes
    for (int i = 0; i < 10 && header.rfind("transport", 0) != 0; ++i) header = doomed.line();
    ASSERT_EQ(header.rfind("transport", 0), 0u) << header;
    doomed.kill_now();
  }
  std::string out;
  ASSERT_EQ(
      run("bench --connect " + address + " --op write,read,send --sizes 4K,1M --iters 5", out), 0)
      << out;
  EXPECT_NE(out.find("shm       send"), std::string::npos) << out;
  EXPECT_TRUE(target.running());
  target.kill_now();
  std::string errors = target.errors();
  EXPECT_NE(errors.find("ferry bench: initiator "), std::string::npos) << errors;
  EXPECT_NE(errors.find("peer_lost"), std::string::npos) << errors;
}

// The bench's control tags (tools/ferry/bench.cpp): a peer written here speaks them to make
// the other side's process meet a failure it did not cause.
constexpr uint64_t kTagSetup = 1;
constexpr uint64_t kTagFailure = 5;

// A hand-made bench peer's messages.
struct FakePeer {
  explicit FakePeer(Engine& e, Peer p) : peer(std::move(p)), buf(8192) {
    region = e.register_memory(buf.data(), buf.size(), Access::kLocal);
  }
  ~FakePeer() { peer.close(); }  // ends a receive still posted
  Status send(uint64_t tag, const std::string& text) {
    std::memcpy(buf.data(), text.data(), text.size());
    return peer.send(tag, region, 0, text.size()).wait(kWait);
  }
  Future post_recv(uint64_t tag) { return peer.recv(tag, region, 4096, 4096); }
  std::string received(const Future& f) const {
    return std::string(reinterpret_cast<const char*>(buf.data() + 4096), f.bytes());
  }
  Peer peer;
  std::vector<uint8_t> buf;
  Region region;
};

TEST(Cli, TargetRefusesABadSetupAndTellsTheInitiator) {
  Background target({"bench", "--listen", "127.0.0.1:0"});
  std::string address = listening_address(target);
  ASSERT_FALSE(address.empty());
  Engine engine(test_config());
  {
    FakePeer initiator(engine, engine.connect(address));
    Future reason = initiator.post_recv(kTagFailure);
    ASSERT_TRUE(initiator.send(kTagSetup, "0 0 0").ok());
    ASSERT_TRUE(reason.wait(kWait).ok()) << reason.status().to_string();
    EXPECT_NE(initiator.received(reason).find("setup: a buffer of 0 bytes asked for"),
              std::string::npos)
        << initiator.received(reason);
  }
  // The listener goes on: a real initiator after the failed one.
  std::string out;
  ASSERT_EQ(run("bench --connect " + address + " --op read --sizes 4K --iters 5", out), 0) << out;
  EXPECT_TRUE(target.running());
  target.kill_now();
  std::string errors = target.errors();
  EXPECT_NE(errors.find("setup: a buffer of 0 bytes asked for"), std::string::npos) << errors;

  // Serving once, the target exits nonzero; its initiator heard why, so it says nothing.
  Background once({"bench", "--listen", "127.0.0.1:0", "--once"});
  address = listening_address(once);
  ASSERT_FALSE(address.empty());
  {
    FakePeer initiator(engine, engine.connect(address));
    Future reason = initiator.post_recv(kTagFailure);
    ASSERT_TRUE(initiator.send(kTagSetup, "lots").ok());
    ASSERT_TRUE(reason.wait(kWait).ok()) << reason.status().to_string();
    EXPECT_NE(initiator.received(reason).find("malformed control message 'lots'"),
              std::string::npos)
        << initiator.received(reason);
  }
  EXPECT_EQ(once.wait(), 1);
  EXPECT_EQ(once.errors(), "");
}

TEST(Cli, InitiatorPrintsTheTargetsReason) {
  Engine engine(test_config());
  Command initiator("bench --connect " + engine.address() + " --op write --sizes 4K --iters 5");
  std::optional<Peer> accepted = engine.accept(kWait);
  ASSERT_TRUE(accepted);
  {
    FakePeer target(engine, *accepted);
    Future setup = target.post_recv(kTagSetup);
    ASSERT_TRUE(setup.wait(kWait).ok()) << setup.status().to_string();
    ASSERT_TRUE(target.send(kTagFailure, "setup: this target refuses every buffer").ok());
  }
  std::string out;
  EXPECT_EQ(initiator.finish(out), 1) << out;
  EXPECT_NE(out.find("ferry bench: target: setup: this target refuses every buffer"),
            std::string::npos)
      << out;
}

bool has_ipv6_loopback() {
  int fd = socket(AF_INET6, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_addr = in6addr_loopback;
  bool ok = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  close(fd);
  return ok;
}

TEST(Cli, ListenerOnEveryInterfaceShowsWhereToConnect) {
  Background v4({"bench", "--listen", "0.0.0.0:0"});
  // The first line names Engine::address(): the first address another host can use.
  std::string address = listening_address(v4);
  std::string port = address.substr(address.rfind(':') + 1);
  ASSERT_FALSE(port.empty()) << address;
  std::vector<std::string> lines;
  // Loopback comes last, after the addresses another host can use.
  for (std::string l = v4.line(); !l.empty(); l = v4.line()) {
    lines.push_back(l);
    if (l.find("(lo, this host only)") != std::string::npos) break;
  }
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines.back(), "reachable at 127.0.0.1:" + port + " (lo, this host only)");
  EXPECT_EQ(lines.front().rfind("reachable at " + address + " (", 0), 0u) << lines.front();
  for (const auto& l : lines) {
    EXPECT_EQ(l.rfind("reachable at ", 0), 0u) << l;
    EXPECT_EQ(l.find('['), std::string::npos) << "IPv6 on an IPv4 listener: " << l;
  }
  v4.kill_now();

  if (!has_ipv6_loopback()) GTEST_SKIP() << "no IPv6 loopback here";
  Background v6({"bench", "--listen", "[::]:0"});
  address = listening_address(v6);
  ASSERT_FALSE(address.empty());
  port = address.substr(address.rfind(':') + 1);
  // Only loopback is dialled: the tests send no traffic to other interfaces.
  std::string out;
  EXPECT_EQ(run("bench --connect '[::1]:" + port + "' --op write --sizes 4K --iters 3", out), 0)
      << out;
  EXPECT_EQ(run("bench --connect 127.0.0.1:" + port + " --op write --sizes 4K --iters 3", out), 0)
      << out;
}

}  // namespace
}  // namespace ferry::test
