// A target process for multi-process tests: registers a patterned region, prints its address
// and descriptor, and serves until its standard input closes.
// usage: ferry_test_target [SIZE [LISTEN_HOST]]   (defaults: 1 MiB, 127.0.0.1)
#include <unistd.h>

#include <iostream>
#include <string>
#include <vector>

#include "ferry/ferry.hpp"

int main(int argc, char** argv) {
  std::size_t size = argc > 1 ? std::stoull(argv[1]) : (1 << 20);
  ferry::Config c;
  c.listen_host = argc > 2 ? argv[2] : "127.0.0.1";
  ferry::Engine engine(c);
  std::vector<uint8_t> mem(size);
  for (std::size_t i = 0; i < size; ++i) mem[i] = static_cast<uint8_t>(i * 31 + 7);
  ferry::Region region = engine.register_memory(mem.data(), size, ferry::Access::kRemoteReadWrite);
  std::cout << "ADDR " << engine.address() << "\nDESC " << region.descriptor().to_string()
            << std::endl;
  char c1;
  while (read(STDIN_FILENO, &c1, 1) > 0) {
  }
  return 0;
}
