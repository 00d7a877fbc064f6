/*
 * libelf_error.c — libelf's error state, for the agent's private libelf.
 *
 * The agent links Debian's libelf.a (agent/meson.build) but not its member
 * elf_error.o: that one keeps the error code in local-exec TLS, which the
 * linker cannot put into a shared object.  These three functions take its
 * place (the linker then never pulls it from the archive); they follow
 * libelf.h: the code is per thread, elf_errno() returns and clears it,
 * elf_errmsg(0) is NULL when there is none and elf_errmsg(-1) is never NULL.
 *
 * The codes are libelf's ELF_E_* in their order (libelfP.h, elfutils 0.188);
 * only their texts live here.
 */
#include <stddef.h>

static const char *const messages[] = {
	"no error",
	"unknown error",
	"unknown ELF version",
	"unknown data type",
	"invalid Elf handle",
	"bad source operand size",
	"bad destination operand size",
	"bad data encoding",
	"out of memory",
	"bad file descriptor",
	"bad ELF file data",
	"bad operation",
	"ELF version not set",
	"bad command",
	"offset out of range",
	"bad fmag field in an archive header",
	"bad archive file",
	"not an archive",
	"no archive index",
	"cannot read the file",
	"cannot write the file",
	"bad ELF class",
	"bad section index",
	"bad operand",
	"bad section",
	"bad command",
	"the ELF header must come first",
	"file descriptor disabled",
	"archive and member descriptors differ",
	"offset out of range",
	"the null section cannot be changed",
	"data and section do not match",
	"bad section header",
	"bad data",
	"unknown data encoding",
	"section too small for its data",
	"bad section alignment",
	"bad section entry size",
	"update of a read-only file",
	"no such file",
	"section groups only in relocatable files",
	"program headers only in executables, shared objects and core files",
	"no program header",
	"bad offset",
	"bad section type",
	"bad section flags",
	"section not compressed",
	"section already compressed",
	"unknown compression type",
	"cannot compress the data",
	"cannot decompress the data",
};

#define NMESSAGES ((int)(sizeof messages / sizeof *messages))
#define UNKNOWN_ERROR 1

static __thread int last_error __attribute__((tls_model("initial-exec")));

/* libelf's internal setter (every libelf function that fails calls it). */
void __libelf_seterrno(int value);
int elf_errno(void);
const char *elf_errmsg(int error);

void __libelf_seterrno(int value)
{
	last_error = value >= 0 && value < NMESSAGES ? value : UNKNOWN_ERROR;
}

int elf_errno(void)
{
	int e = last_error;

	last_error = 0;
	return e;
}

const char *elf_errmsg(int error)
{
	if (error == 0)
		return last_error ? messages[last_error] : NULL;
	if (error == -1)
		return messages[last_error];
	return error > 0 && error < NMESSAGES ? messages[error] : messages[UNKNOWN_ERROR];
}
