// The `paratrain` program: parses the subcommand and hands over to the layers.
#include <cstdio>
int main(int argc, char** argv) {
  std::puts("paratrain");
  return 0;
}
