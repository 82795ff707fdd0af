#include "common/certificate_authority.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <stdexcept>
#include <utility>

namespace switchboard::certs {

namespace {

void require(bool ok, const std::string& step) {
  if (!ok) throw std::runtime_error("certificate authority: " + step + " failed");
}

struct KeyFree {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};
struct CertFree {
  void operator()(X509* cert) const { X509_free(cert); }
};
using Key = std::unique_ptr<EVP_PKEY, KeyFree>;
using Cert = std::unique_ptr<X509, CertFree>;

Key new_key() {
  Key key(EVP_EC_gen("P-256"));
  require(key != nullptr, "EVP_EC_gen");
  return key;
}

void add_extension(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX context;
  X509V3_set_ctx_nodb(&context);
  X509V3_set_ctx(&context, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* extension = X509V3_EXT_conf_nid(nullptr, &context, nid, value);
  require(extension != nullptr, "X509V3_EXT_conf_nid");
  X509_add_ext(cert, extension, -1);
  X509_EXTENSION_free(extension);
}

// A certificate for `name` with `key`, signed by `issuer_key` (issuer:
// null for a self-signed one).
Cert make_cert(const std::string& name, EVP_PKEY* key, X509* issuer, EVP_PKEY* issuer_key,
               long serial, bool ca, int days, bool expired) {
  Cert cert(X509_new());
  require(cert != nullptr, "X509_new");
  X509_set_version(cert.get(), 2);
  ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), serial);
  constexpr long kDay = 24 * 3600;
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), expired ? -2 * kDay : -60);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), expired ? -kDay : days * kDay);
  require(X509_set_pubkey(cert.get(), key) == 1, "X509_set_pubkey");
  X509_NAME* subject = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(subject, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(name.c_str()), -1, -1, 0);
  X509* signer = issuer != nullptr ? issuer : cert.get();
  X509_set_issuer_name(cert.get(), X509_get_subject_name(signer));
  if (ca) {
    add_extension(cert.get(), signer, NID_basic_constraints, "critical,CA:TRUE");
    add_extension(cert.get(), signer, NID_key_usage, "critical,keyCertSign,cRLSign");
  } else {
    add_extension(cert.get(), signer, NID_basic_constraints, "critical,CA:FALSE");
    add_extension(cert.get(), signer, NID_ext_key_usage, "serverAuth,clientAuth");
  }
  require(X509_sign(cert.get(), issuer_key, EVP_sha256()) > 0, "X509_sign");
  return cert;
}

void write_cert(const std::string& path, X509* cert) {
  BIO* out = BIO_new_file(path.c_str(), "w");
  require(out != nullptr, "writing " + path);
  const bool ok = PEM_write_bio_X509(out, cert) == 1;
  BIO_free(out);
  require(ok, "PEM_write_bio_X509");
}

void write_key(const std::string& path, EVP_PKEY* key) {
  // Created with mode 0600 before any byte of the key is in it.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  require(fd >= 0 && ::fchmod(fd, 0600) == 0, "creating " + path);
  ::close(fd);
  BIO* out = BIO_new_file(path.c_str(), "w");
  require(out != nullptr, "writing " + path);
  const bool ok = PEM_write_bio_PrivateKey(out, key, nullptr, nullptr, 0, nullptr, nullptr) == 1;
  BIO_free(out);
  require(ok, "PEM_write_bio_PrivateKey");
}

}  // namespace

struct CertificateAuthority::State {
  Key key;
  Cert cert;
  long next_serial = 2;
};

CertificateAuthority::CertificateAuthority(std::string dir, const std::string& name, int days)
    : state_(std::make_unique<State>()), dir_(std::move(dir)) {
  state_->key = new_key();
  state_->cert =
      make_cert(name, state_->key.get(), nullptr, state_->key.get(), 1, true, days, false);
  ca_file_ = dir_ + "/ca.pem";
  write_cert(ca_file_, state_->cert.get());
  write_key(dir_ + "/ca.key", state_->key.get());
}

CertificateAuthority::~CertificateAuthority() = default;

bool CertificateAuthority::plain_name(const std::string& name) {
  return !name.empty() &&
         name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                "0123456789-_.") == std::string::npos &&
         name != "ca" && name[0] != '.';
}

CertificateFiles CertificateAuthority::issue(const std::string& common_name, int days,
                                             bool expired) {
  if (!plain_name(common_name)) {
    throw std::invalid_argument("certificate authority: \"" + common_name +
                                "\" is not a plain name (letters, digits, '-', '_', '.'; not "
                                "\"ca\")");
  }
  Key key = new_key();
  Cert cert = make_cert(common_name, key.get(), state_->cert.get(), state_->key.get(),
                        state_->next_serial++, false, days, expired);
  CertificateFiles files;
  files.cert_file = dir_ + "/" + common_name + ".pem";
  files.key_file = dir_ + "/" + common_name + ".key";
  write_cert(files.cert_file, cert.get());
  write_key(files.key_file, key.get());
  return files;
}

}  // namespace switchboard::certs
