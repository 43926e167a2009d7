// A target process for multi-process tests: registers a patterned region, prints its address
// and descriptor, and serves until its standard input closes.
// usage: ferry_test_target [SIZE [LISTEN_HOST [TRANSPORTS]]]
//   (defaults: 1 MiB, 127.0.0.1, the default transports; TRANSPORTS: names, comma-separated)
#include <unistd.h>

#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "ferry/ferry.hpp"

int main(int argc, char** argv) {
  std::size_t size = argc > 1 ? std::stoull(argv[1]) : (1 << 20);
  ferry::Config c;
  c.listen_host = argc > 2 ? argv[2] : "127.0.0.1";
  if (argc > 3) {
    c.transports.clear();
    std::istringstream names(argv[3]);
    for (std::string name; std::getline(names, name, ',');)
      c.transports.push_back(ferry::transport_named(name).value());
  }
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
