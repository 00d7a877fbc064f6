/*
 * keys.c — the cluster CA and the host certificates (see spd.h).
 *
 * Keys are EC P-256: every TLS 1.3 stack speaks it and a key is made in a
 * millisecond.  A host certificate serves both ends of a daemon-to-daemon
 * connection (extendedKeyUsage serverAuth and clientAuth).
 *
 * Files are written so that a failure or a hostile user leaves nothing
 * half-written and redirects nothing:
 *   1. KEYDIR is made 0700 if missing, then opened O_DIRECTORY|O_NOFOLLOW
 *      and accepted only if it is the caller's and no one else may write
 *      it: every later step is relative to that descriptor, so swapping the
 *      path afterwards changes nothing;
 *   2. each file is written under a temporary name (O_CREAT|O_EXCL|
 *      O_NOFOLLOW, its final mode from the start), flushed to disk,
 *   3. then renamed to its name with RENAME_NOREPLACE: an existing key is
 *      never replaced, and a reader never sees half a file;
 *   4. the private key is written first and the certificate last, so a
 *      certificate never exists without its key.
 */
#include "spd_internal.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ossl.h"       /* OpenSSL, loaded at the first call */

/* OpenSSL's last error as text, for a message. */
static const char *ssl_why(void)
{
	static char buf[256];
	unsigned long e = ERR_get_error();

	if (!e)
		return "unknown OpenSSL error";
	ERR_error_string_n(e, buf, sizeof buf);
	ERR_clear_error();
	return buf;
}

int spd_host_name_kind(const char *name, sp_err *err)
{
	unsigned char addr[16];
	size_t len = strlen(name), label = 0;

	if (inet_pton(AF_INET, name, addr) == 1 || inet_pton(AF_INET6, name, addr) == 1)
		return 1;
	if (len == 0 || len > 253 || strcmp(name, "ca") == 0)
		goto bad;
	for (const char *p = name; *p; p++) {
		if (*p == '.') {
			if (label == 0)
				goto bad;
			label = 0;
		} else if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
			   (*p >= '0' && *p <= '9') || (*p == '-' && label > 0)) {
			if (++label > 63)
				goto bad;
		} else {
			goto bad;
		}
	}
	if (label == 0 || name[len - 1] == '-')
		goto bad;
	return 0;
bad:
	return sp_fail(err, "'%s' is not a host name or an IP address (a DNS name of letters, "
		       "digits, '-' and '.', or an address such as 10.0.0.2; 'ca' is the CA's)",
		       name);
}

/* Step 1: KEYDIR, made if missing, opened and checked. */
int spd_keys_open_dir(const char *keydir, int create, sp_err *err)
{
	struct stat st;
	int fd;

	if (create && mkdir(keydir, 0700) != 0 && errno != EEXIST)
		return sp_fail(err, "cannot create the key directory %s: %s", keydir,
			       strerror(errno));
	fd = open(keydir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return sp_fail(err, "key directory %s: %s", keydir,
			       errno == ELOOP || errno == ENOTDIR ? "not a directory (a link is "
			       "not followed)" : errno == ENOENT ? "no such directory (make the CA "
			       "first: sptrace keys init KEYDIR)" : strerror(errno));
	if (!sp_fd_private(fd, &st)) {
		close(fd);
		return sp_fail(err, "key directory %s belongs to uid %u with mode %03o: keys are "
			       "kept only in a directory that is yours and that no one else may "
			       "write; use another directory", keydir, (unsigned)st.st_uid,
			       (unsigned)(st.st_mode & 0777));
	}
	return fd;
}

static int exists_at(int dfd, const char *name)
{
	struct stat st;

	return fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0;
}

/* Steps 2 and 3: `name` in KEYDIR, written by `put` (a PEM writer). */
typedef int (*pem_put)(BIO *out, void *obj);

static int put_key(BIO *out, void *obj)
{
	return PEM_write_bio_PrivateKey(out, obj, NULL, NULL, 0, NULL, NULL);
}

static int put_cert(BIO *out, void *obj)
{
	return PEM_write_bio_X509(out, obj);
}

static int write_new(int dfd, const char *keydir, const char *name, mode_t mode, pem_put put,
		     void *obj, sp_err *err)
{
	char tmp[320];
	BIO *bio;
	int fd, ok;

	snprintf(tmp, sizeof tmp, ".%s.%d.tmp", name, (int)getpid());
	fd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
	if (fd < 0)
		return sp_fail(err, "cannot create %s/%s: %s", keydir, tmp, strerror(errno));
	bio = BIO_new_fd(fd, BIO_NOCLOSE);
	ok = bio && put(bio, obj) == 1 && BIO_flush(bio) == 1;
	BIO_free(bio);
	if (!ok || fchmod(fd, mode) != 0 || fsync(fd) != 0) {
		sp_fail(err, "cannot write %s/%s: %s", keydir, tmp, ok ? strerror(errno) : ssl_why());
		close(fd);
		unlinkat(dfd, tmp, 0);
		return -1;
	}
	close(fd);
	if (renameat2(dfd, tmp, dfd, name, RENAME_NOREPLACE) != 0) {
		sp_fail(err, "cannot put %s/%s in place: %s", keydir, name,
			errno == EEXIST ? "it exists already (remove it first to replace it)"
			: strerror(errno));
		unlinkat(dfd, tmp, 0);
		return -1;
	}
	return 0;
}

/* Step 4: the key, then the certificate; a key whose certificate could not
 * be written is removed again. */
static int write_pair(int dfd, const char *keydir, const char *key_name, EVP_PKEY *key,
		      const char *cert_name, X509 *cert, sp_err *err)
{
	if (write_new(dfd, keydir, key_name, 0600, put_key, key, err))
		return -1;
	if (write_new(dfd, keydir, cert_name, 0644, put_cert, cert, err)) {
		unlinkat(dfd, key_name, 0);
		return -1;
	}
	return 0;
}

void *spd_keys_read(int dfd, const char *keydir, const char *name, int is_key, sp_err *err)
{
	struct stat st;
	void *obj = NULL;
	BIO *bio;
	int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);

	if (fd < 0) {
		sp_fail(err, "%s/%s: %s%s", keydir, name, strerror(errno),
			errno == ENOENT ? " (make the CA first: sptrace keys init KEYDIR)" : "");
		return NULL;
	}
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
		sp_fail(err, "%s/%s is not a regular file of yours; not used", keydir, name);
		close(fd);
		return NULL;
	}
	if (is_key && (st.st_mode & 077)) {
		sp_fail(err, "%s/%s: a private key that others may read (mode %03o) is not used; "
			"'chmod 600 %s/%s', and consider it known to them", keydir, name,
			(unsigned)(st.st_mode & 0777), keydir, name);
		close(fd);
		return NULL;
	}
	bio = BIO_new_fd(fd, BIO_NOCLOSE);
	if (bio)
		obj = is_key ? (void *)PEM_read_bio_PrivateKey(bio, NULL, NULL, NULL)
		      : (void *)PEM_read_bio_X509(bio, NULL, NULL, NULL);
	if (!obj)
		sp_fail(err, "%s/%s: not a PEM %s: %s", keydir, name,
			is_key ? "private key" : "certificate", ssl_why());
	BIO_free(bio);
	close(fd);
	return obj;
}

static int add_ext(X509 *cert, X509 *issuer, int nid, const char *value)
{
	X509V3_CTX ctx;
	X509_EXTENSION *ext;
	int ok;

	X509V3_set_ctx(&ctx, issuer, cert, NULL, NULL, 0);
	ext = X509V3_EXT_conf_nid(NULL, &ctx, nid, value);
	ok = ext && X509_add_ext(cert, ext, -1) == 1;
	X509_EXTENSION_free(ext);
	return ok;
}

/* A random positive 127-bit serial number. */
static int set_serial(X509 *cert)
{
	unsigned char raw[16];
	BIGNUM *bn;
	int ok;

	if (RAND_bytes(raw, sizeof raw) != 1)
		return 0;
	raw[0] &= 0x7f;
	bn = BN_bin2bn(raw, sizeof raw, NULL);
	ok = bn && BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(cert)) != NULL;
	BN_free(bn);
	return ok;
}

/* A certificate for `key` named `cn`, signed by ca_key (ca_cert NULL:
 * self-signed), with the extensions of a CA or of a host. */
static X509 *make_cert(EVP_PKEY *key, const char *cn, int days, X509 *ca_cert, EVP_PKEY *ca_key,
		       const char *san)
{
	X509 *cert = X509_new();
	X509_NAME *subj = X509_NAME_new();
	X509 *issuer;
	int ok;

	if (!cert || !subj)
		goto fail;
	issuer = ca_cert ? ca_cert : cert;
	ok = X509_set_version(cert, 2) && set_serial(cert) &&
	     X509_gmtime_adj(X509_getm_notBefore(cert), -3600) &&
	     X509_gmtime_adj(X509_getm_notAfter(cert), (long)days * 86400) &&
	     X509_set_pubkey(cert, key) &&
	     X509_NAME_add_entry_by_txt(subj, "O", MBSTRING_ASC, (const unsigned char *)"sptrace",
					-1, -1, 0) &&
	     X509_NAME_add_entry_by_txt(subj, "CN", MBSTRING_ASC, (const unsigned char *)cn, -1,
					-1, 0) &&
	     X509_set_subject_name(cert, subj) &&
	     X509_set_issuer_name(cert, X509_get_subject_name(issuer)) &&
	     add_ext(cert, issuer, NID_subject_key_identifier, "hash");
	if (ok && !ca_cert)
		ok = add_ext(cert, issuer, NID_basic_constraints, "critical,CA:TRUE,pathlen:0") &&
		     add_ext(cert, issuer, NID_key_usage, "critical,keyCertSign,cRLSign");
	else if (ok)
		ok = add_ext(cert, issuer, NID_authority_key_identifier, "keyid:always") &&
		     add_ext(cert, issuer, NID_basic_constraints, "critical,CA:FALSE") &&
		     add_ext(cert, issuer, NID_key_usage, "critical,digitalSignature") &&
		     add_ext(cert, issuer, NID_ext_key_usage, "serverAuth,clientAuth") &&
		     add_ext(cert, issuer, NID_subject_alt_name, san);
	if (ok && X509_sign(cert, ca_key, EVP_sha256()) > 0) {
		X509_NAME_free(subj);
		return cert;
	}
fail:
	X509_NAME_free(subj);
	X509_free(cert);
	return NULL;
}

static int check_days(int days, sp_err *err)
{
	if (days < 1 || days > 36500)
		return sp_fail(err, "--days %d: give a validity of 1 to 36500 days", days);
	return 0;
}

int spd_keys_init(const char *keydir, int days, sp_err *err)
{
	EVP_PKEY *key = NULL;
	X509 *cert = NULL;
	int dfd, rc = -1;

	if (check_days(days, err) || (dfd = spd_keys_open_dir(keydir, 1, err)) < 0)
		return -1;
	if (exists_at(dfd, "ca.key") || exists_at(dfd, "ca.crt")) {
		sp_fail(err, "%s already holds a CA (ca.key, ca.crt); it is never replaced: hosts "
			"trust it.  Remove both files to start a new cluster", keydir);
		goto out;
	}
	if (!(key = EVP_EC_gen("P-256")) ||
	    !(cert = make_cert(key, "sptrace cluster CA", days, NULL, key, NULL))) {
		sp_fail(err, "cannot make the CA: %s", ssl_why());
		goto out;
	}
	rc = write_pair(dfd, keydir, "ca.key", key, "ca.crt", cert, err);
out:
	X509_free(cert);
	EVP_PKEY_free(key);
	close(dfd);
	return rc;
}

int spd_keys_issue(const char *keydir, const char *name, int days, sp_err *err)
{
	char file_key[300], file_crt[300], san[300];
	EVP_PKEY *ca_key = NULL, *key = NULL;
	X509 *ca_cert = NULL, *cert = NULL;
	int kind, dfd, rc = -1;

	if (check_days(days, err) || (kind = spd_host_name_kind(name, err)) < 0 ||
	    (dfd = spd_keys_open_dir(keydir, 0, err)) < 0)
		return -1;
	snprintf(file_key, sizeof file_key, "%s.key", name);
	snprintf(file_crt, sizeof file_crt, "%s.crt", name);
	snprintf(san, sizeof san, "%s:%s", kind ? "IP" : "DNS", name);
	if (exists_at(dfd, file_key) || exists_at(dfd, file_crt)) {
		sp_fail(err, "%s/%s already has keys (%s, %s); remove both to issue new ones",
			keydir, name, file_key, file_crt);
		goto out;
	}
	if (!(ca_key = spd_keys_read(dfd, keydir, "ca.key", 1, err)) ||
	    !(ca_cert = spd_keys_read(dfd, keydir, "ca.crt", 0, err)))
		goto out;
	if (X509_check_private_key(ca_cert, ca_key) != 1) {
		ERR_clear_error();
		sp_fail(err, "%s/ca.key is not the key of %s/ca.crt", keydir, keydir);
		goto out;
	}
	if (!(key = EVP_EC_gen("P-256")) ||
	    !(cert = make_cert(key, name, days, ca_cert, ca_key, san))) {
		sp_fail(err, "cannot make the certificate of %s: %s", name, ssl_why());
		goto out;
	}
	rc = write_pair(dfd, keydir, file_key, key, file_crt, cert, err);
out:
	X509_free(cert);
	X509_free(ca_cert);
	EVP_PKEY_free(key);
	EVP_PKEY_free(ca_key);
	close(dfd);
	return rc;
}
