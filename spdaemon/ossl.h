/*
 * ossl.h -- OpenSSL for spd's TLS and keys (tls.c, keys.c, frame.c), loaded at
 * the first call (libssl.so.3, libcrypto.so.3 with it), not linked: every
 * sptrace command started 0.7-0.9 ms slower with both loaded
 * (bench/START.md), and only collect, status and keys use them.
 *
 * Included after nothing of OpenSSL's but its headers: each function the
 * library calls is a macro for its slot in spd_ossl, filled by
 * spd_ossl_need at the first call.  A process that cannot load them says so
 * on stderr and exits 1 (spdaemon and sptrace depend on Debian's libssl3).
 * A function not in SPD_OSSL_FUNCS is not linked at all: the build fails.
 */
#ifndef SPD_OSSL_H
#define SPD_OSSL_H

#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#define SPD_OSSL_FUNCS(X) \
	X(BIO_ctrl) \
	X(BIO_free) \
	X(BIO_new_fd) \
	X(BN_bin2bn) \
	X(BN_free) \
	X(BN_to_ASN1_INTEGER) \
	X(ERR_clear_error) \
	X(ERR_error_string_n) \
	X(ERR_get_error) \
	X(EVP_PKEY_Q_keygen) \
	X(EVP_PKEY_free) \
	X(EVP_sha256) \
	X(PEM_read_bio_PrivateKey) \
	X(PEM_read_bio_X509) \
	X(PEM_write_bio_PrivateKey) \
	X(PEM_write_bio_X509) \
	X(RAND_bytes) \
	X(SSL_CTX_check_private_key) \
	X(SSL_CTX_ctrl) \
	X(SSL_CTX_free) \
	X(SSL_CTX_get_cert_store) \
	X(SSL_CTX_new) \
	X(SSL_CTX_set_num_tickets) \
	X(SSL_CTX_set_verify) \
	X(SSL_CTX_use_PrivateKey) \
	X(SSL_CTX_use_certificate) \
	X(SSL_accept) \
	X(SSL_connect) \
	X(SSL_ctrl) \
	X(SSL_free) \
	X(SSL_get0_param) \
	X(SSL_get1_peer_certificate) \
	X(SSL_get_error) \
	X(SSL_get_verify_result) \
	X(SSL_new) \
	X(SSL_read_ex) \
	X(SSL_set1_host) \
	X(SSL_set_fd) \
	X(SSL_shutdown) \
	X(SSL_write_ex) \
	X(TLS_client_method) \
	X(TLS_server_method) \
	X(X509V3_EXT_conf_nid) \
	X(X509V3_set_ctx) \
	X(X509_EXTENSION_free) \
	X(X509_NAME_add_entry_by_txt) \
	X(X509_NAME_free) \
	X(X509_NAME_get_text_by_NID) \
	X(X509_NAME_new) \
	X(X509_STORE_add_cert) \
	X(X509_VERIFY_PARAM_set1_ip_asc) \
	X(X509_add_ext) \
	X(X509_check_private_key) \
	X(X509_free) \
	X(X509_get_serialNumber) \
	X(X509_get_subject_name) \
	X(X509_getm_notAfter) \
	X(X509_getm_notBefore) \
	X(X509_gmtime_adj) \
	X(X509_new) \
	X(X509_set_issuer_name) \
	X(X509_set_pubkey) \
	X(X509_set_subject_name) \
	X(X509_set_version) \
	X(X509_sign) \
	X(X509_verify_cert_error_string)

struct spd_ossl {
#define SPD_OSSL_SLOT(f) __typeof__(&f) f;
	SPD_OSSL_FUNCS(SPD_OSSL_SLOT)
#undef SPD_OSSL_SLOT
};

extern struct spd_ossl spd_ossl;
void spd_ossl_need(void);

#ifndef SPD_OSSL_LOADER
#define BIO_ctrl (spd_ossl_need(), spd_ossl.BIO_ctrl)
#define BIO_free (spd_ossl_need(), spd_ossl.BIO_free)
#define BIO_new_fd (spd_ossl_need(), spd_ossl.BIO_new_fd)
#define BN_bin2bn (spd_ossl_need(), spd_ossl.BN_bin2bn)
#define BN_free (spd_ossl_need(), spd_ossl.BN_free)
#define BN_to_ASN1_INTEGER (spd_ossl_need(), spd_ossl.BN_to_ASN1_INTEGER)
#define ERR_clear_error (spd_ossl_need(), spd_ossl.ERR_clear_error)
#define ERR_error_string_n (spd_ossl_need(), spd_ossl.ERR_error_string_n)
#define ERR_get_error (spd_ossl_need(), spd_ossl.ERR_get_error)
#define EVP_PKEY_Q_keygen (spd_ossl_need(), spd_ossl.EVP_PKEY_Q_keygen)
#define EVP_PKEY_free (spd_ossl_need(), spd_ossl.EVP_PKEY_free)
#define EVP_sha256 (spd_ossl_need(), spd_ossl.EVP_sha256)
#define PEM_read_bio_PrivateKey (spd_ossl_need(), spd_ossl.PEM_read_bio_PrivateKey)
#define PEM_read_bio_X509 (spd_ossl_need(), spd_ossl.PEM_read_bio_X509)
#define PEM_write_bio_PrivateKey (spd_ossl_need(), spd_ossl.PEM_write_bio_PrivateKey)
#define PEM_write_bio_X509 (spd_ossl_need(), spd_ossl.PEM_write_bio_X509)
#define RAND_bytes (spd_ossl_need(), spd_ossl.RAND_bytes)
#define SSL_CTX_check_private_key (spd_ossl_need(), spd_ossl.SSL_CTX_check_private_key)
#define SSL_CTX_ctrl (spd_ossl_need(), spd_ossl.SSL_CTX_ctrl)
#define SSL_CTX_free (spd_ossl_need(), spd_ossl.SSL_CTX_free)
#define SSL_CTX_get_cert_store (spd_ossl_need(), spd_ossl.SSL_CTX_get_cert_store)
#define SSL_CTX_new (spd_ossl_need(), spd_ossl.SSL_CTX_new)
#define SSL_CTX_set_num_tickets (spd_ossl_need(), spd_ossl.SSL_CTX_set_num_tickets)
#define SSL_CTX_set_verify (spd_ossl_need(), spd_ossl.SSL_CTX_set_verify)
#define SSL_CTX_use_PrivateKey (spd_ossl_need(), spd_ossl.SSL_CTX_use_PrivateKey)
#define SSL_CTX_use_certificate (spd_ossl_need(), spd_ossl.SSL_CTX_use_certificate)
#define SSL_accept (spd_ossl_need(), spd_ossl.SSL_accept)
#define SSL_connect (spd_ossl_need(), spd_ossl.SSL_connect)
#define SSL_ctrl (spd_ossl_need(), spd_ossl.SSL_ctrl)
#define SSL_free (spd_ossl_need(), spd_ossl.SSL_free)
#define SSL_get0_param (spd_ossl_need(), spd_ossl.SSL_get0_param)
#define SSL_get1_peer_certificate (spd_ossl_need(), spd_ossl.SSL_get1_peer_certificate)
#define SSL_get_error (spd_ossl_need(), spd_ossl.SSL_get_error)
#define SSL_get_verify_result (spd_ossl_need(), spd_ossl.SSL_get_verify_result)
#define SSL_new (spd_ossl_need(), spd_ossl.SSL_new)
#define SSL_read_ex (spd_ossl_need(), spd_ossl.SSL_read_ex)
#define SSL_set1_host (spd_ossl_need(), spd_ossl.SSL_set1_host)
#define SSL_set_fd (spd_ossl_need(), spd_ossl.SSL_set_fd)
#define SSL_shutdown (spd_ossl_need(), spd_ossl.SSL_shutdown)
#define SSL_write_ex (spd_ossl_need(), spd_ossl.SSL_write_ex)
#define TLS_client_method (spd_ossl_need(), spd_ossl.TLS_client_method)
#define TLS_server_method (spd_ossl_need(), spd_ossl.TLS_server_method)
#define X509V3_EXT_conf_nid (spd_ossl_need(), spd_ossl.X509V3_EXT_conf_nid)
#define X509V3_set_ctx (spd_ossl_need(), spd_ossl.X509V3_set_ctx)
#define X509_EXTENSION_free (spd_ossl_need(), spd_ossl.X509_EXTENSION_free)
#define X509_NAME_add_entry_by_txt (spd_ossl_need(), spd_ossl.X509_NAME_add_entry_by_txt)
#define X509_NAME_free (spd_ossl_need(), spd_ossl.X509_NAME_free)
#define X509_NAME_get_text_by_NID (spd_ossl_need(), spd_ossl.X509_NAME_get_text_by_NID)
#define X509_NAME_new (spd_ossl_need(), spd_ossl.X509_NAME_new)
#define X509_STORE_add_cert (spd_ossl_need(), spd_ossl.X509_STORE_add_cert)
#define X509_VERIFY_PARAM_set1_ip_asc (spd_ossl_need(), spd_ossl.X509_VERIFY_PARAM_set1_ip_asc)
#define X509_add_ext (spd_ossl_need(), spd_ossl.X509_add_ext)
#define X509_check_private_key (spd_ossl_need(), spd_ossl.X509_check_private_key)
#define X509_free (spd_ossl_need(), spd_ossl.X509_free)
#define X509_get_serialNumber (spd_ossl_need(), spd_ossl.X509_get_serialNumber)
#define X509_get_subject_name (spd_ossl_need(), spd_ossl.X509_get_subject_name)
#define X509_getm_notAfter (spd_ossl_need(), spd_ossl.X509_getm_notAfter)
#define X509_getm_notBefore (spd_ossl_need(), spd_ossl.X509_getm_notBefore)
#define X509_gmtime_adj (spd_ossl_need(), spd_ossl.X509_gmtime_adj)
#define X509_new (spd_ossl_need(), spd_ossl.X509_new)
#define X509_set_issuer_name (spd_ossl_need(), spd_ossl.X509_set_issuer_name)
#define X509_set_pubkey (spd_ossl_need(), spd_ossl.X509_set_pubkey)
#define X509_set_subject_name (spd_ossl_need(), spd_ossl.X509_set_subject_name)
#define X509_set_version (spd_ossl_need(), spd_ossl.X509_set_version)
#define X509_sign (spd_ossl_need(), spd_ossl.X509_sign)
#define X509_verify_cert_error_string (spd_ossl_need(), spd_ossl.X509_verify_cert_error_string)
#endif

#endif
