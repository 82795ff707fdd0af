// certs: makes a job's certificate authority and one certificate per name,
// for PIPE's mutual TLS (docs/security.md):
//
//   certs --dir DIR [--days N] NAME...
//
// writes DIR/ca.pem and DIR/ca.key, and DIR/NAME.pem and DIR/NAME.key for
// each NAME (keys with mode 0600), then prints the variables a worker on the
// host NAME needs. DIR is created (mode 0700) and must not hold a ca.pem
// already: a new CA would not trust the certificates the old one signed.
#include <fmt/format.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "common/certificate_authority.h"
#include "common/cli.h"

int main(int argc, char** argv) {
  std::string dir;
  int days = 365;
  std::vector<std::string> names;
  CLI::App app(
      "Makes a certificate authority for one job and a certificate it signs for each NAME "
      "(a host, or a worker), as PEM files for PIPE's mutual TLS. Copy DIR/ca.pem and a "
      "NAME's .pem and .key to each host, and point SWITCHBOARD_TLS_CERT_FILE, "
      "SWITCHBOARD_TLS_KEY_FILE and SWITCHBOARD_TLS_CA_FILE at them. Keep DIR/ca.key "
      "private: whoever has it can let anyone in.",
      "certs");
  switchboard::cli::set_synopsis(app, "certs --dir DIR [--days N] NAME...");
  app.add_option("--dir", dir, "where the files go (created)")->required()->type_name("DIR");
  app.add_option("--days", days, "how long the certificates are valid")
      ->type_name("N")
      ->check(switchboard::cli::in_range(1, 36500));
  app.add_option("names", names, "one certificate per name (letters, digits, '-', '_', '.')")
      ->required()
      ->type_name("NAME");
  if (auto status = switchboard::cli::report(app, switchboard::cli::parse(app, argc, argv))) {
    return *status;
  }
  for (const std::string& name : names) {
    if (!switchboard::certs::CertificateAuthority::plain_name(name)) {
      fmt::print(stderr,
                 "certs: \"{}\" is not a plain name (letters, digits, '-', '_', '.'; not "
                 "\"ca\")\n",
                 name);
      return 2;
    }
  }
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    fmt::print(stderr, "certs: cannot create {}: {}\n", dir, std::strerror(errno));
    return 1;
  }
  struct stat info {};
  if (::stat((dir + "/ca.pem").c_str(), &info) == 0) {
    fmt::print(stderr,
               "certs: {}/ca.pem exists; a new CA would not trust what the old one signed "
               "(pick another directory)\n",
               dir);
    return 1;
  }
  try {
    switchboard::certs::CertificateAuthority ca(dir, "switchboard job CA", days);
    for (const std::string& name : names) {
      const switchboard::certs::CertificateFiles files = ca.issue(name, days);
      fmt::print("# {}\nSWITCHBOARD_TLS_CERT_FILE={}\nSWITCHBOARD_TLS_KEY_FILE={}\n"
                 "SWITCHBOARD_TLS_CA_FILE={}\n",
                 name, files.cert_file, files.key_file, ca.ca_file());
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "certs: {}\n", e.what());
    return 1;
  }
  return 0;
}
