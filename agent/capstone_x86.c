/*
 * capstone_x86.c — the agent's capstone decodes x86 only.
 *
 * Debian's libcapstone.a holds every architecture, and its cs.o refers to
 * each one's two entry points (<Arch>_global_init, <Arch>_option, called
 * by cs_open and cs_option): linked whole, the tables of ARM, AArch64,
 * Mips, PowerPC, ... made the agent 8 MB, all of it copied into the target
 * at every attach (injector: the .so goes through a memfd while a thread
 * is stopped).  The agent analyses x86-64 code only, so these stand in for
 * the other architectures' entry points and the linker never takes their
 * modules from the archive.  cs_open for one of them fails with
 * CS_ERR_ARCH.  Should capstone's internals change, the linker takes a
 * real module too and fails on the duplicate definition: never silently.
 */
#include <capstone/capstone.h>
#include <stddef.h>

struct cs_struct;

#define NOT_HERE(arch)                                                                  \
	cs_err arch##_global_init(struct cs_struct *ud);                                \
	cs_err arch##_option(struct cs_struct *handle, cs_opt_type type, size_t value); \
	cs_err arch##_global_init(struct cs_struct *ud)                                 \
	{                                                                               \
		(void)ud;                                                               \
		return CS_ERR_ARCH;                                                     \
	}                                                                               \
	cs_err arch##_option(struct cs_struct *handle, cs_opt_type type, size_t value)  \
	{                                                                               \
		(void)handle;                                                           \
		(void)type;                                                             \
		(void)value;                                                            \
		return CS_ERR_ARCH;                                                     \
	}

NOT_HERE(ARM)
NOT_HERE(AArch64)
NOT_HERE(Mips)
NOT_HERE(PPC)
NOT_HERE(Sparc)
NOT_HERE(SystemZ)
NOT_HERE(XCore)
NOT_HERE(M68K)
NOT_HERE(TMS320C64x)
NOT_HERE(M680X)
NOT_HERE(EVM)
