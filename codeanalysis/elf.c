/*
 * elf.c — read what the analysis needs from an ELF file with libelf:
 * sections (code and the data that jump tables and GOT slots live in),
 * function symbols from .symtab and .dynsym, GOT slots named by their dynamic
 * relocations, the GNU build-id and the .gnu_debuglink.
 *
 * The file is mapped read-only once; every later read is bounds-checked
 * against the section it comes from, so a malformed file gives an error or
 * fewer facts, never an out-of-bounds read.
 */
#include "ca_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Sections with file bytes worth keeping: code, read-only data that can
 * hold jump tables or be the target of a RIP-relative call, and the Go
 * runtime's tables (runtimes.c). */
static bool keep_section(const char *name, const GElf_Shdr *sh)
{
	if (sh->sh_type == SHT_NOBITS || !(sh->sh_flags & SHF_ALLOC) || sh->sh_size == 0)
		return false;
	if (sh->sh_flags & SHF_EXECINSTR)
		return true;
	return strncmp(name, ".rodata", 7) == 0 || strcmp(name, ".data.rel.ro") == 0 ||
	       strcmp(name, ".got") == 0 || strcmp(name, ".got.plt") == 0 ||
	       strcmp(name, ".eh_frame") == 0 || strcmp(name, ".gcc_except_table") == 0 ||
	       strcmp(name, ".eh_frame_hdr") == 0 || strncmp(name, ".data", 5) == 0 ||
	       strcmp(name, ".gopclntab") == 0 || strcmp(name, ".go.buildinfo") == 0;
}

static int add_section(ca_elf *e, size_t *cap, const char *name, const GElf_Shdr *sh, sp_err *err)
{
	ca_section *s;

	if (sh->sh_offset > e->map_size || sh->sh_size > e->map_size - sh->sh_offset)
		return sp_fail(err, "%s: section %s extends past the end of the file "
			       "(offset %#llx, size %#llx, file %zu bytes): the file is truncated or corrupt",
			       e->path, name, (unsigned long long)sh->sh_offset,
			       (unsigned long long)sh->sh_size, e->map_size);
	if (sp_grow((void **)&e->secs, cap, e->nsecs + 1, sizeof *e->secs))
		return sp_fail(err, "%s: out of memory", e->path);
	s = &e->secs[e->nsecs++];
	memset(s, 0, sizeof *s);
	snprintf(s->name, sizeof s->name, "%s", name);
	s->addr = sh->sh_addr;
	s->size = sh->sh_size;
	s->data = e->map + sh->sh_offset;
	s->exec = (sh->sh_flags & SHF_EXECINSTR) != 0;
	return 0;
}

static void read_buildid(ca_elf *e, Elf_Data *d)
{
	GElf_Nhdr nh;
	size_t off = 0, noff, doff;

	while ((off = gelf_getnote(d, off, &nh, &noff, &doff)) > 0) {
		if (nh.n_type == NT_GNU_BUILD_ID && nh.n_namesz == 4 &&
		    memcmp((char *)d->d_buf + noff, "GNU", 4) == 0 &&
		    nh.n_descsz > 0 && nh.n_descsz <= sizeof e->buildid) {
			static const char hex[] = "0123456789abcdef";

			memcpy(e->buildid, (char *)d->d_buf + doff, nh.n_descsz);
			e->buildid_len = nh.n_descsz;
			for (size_t i = 0; i < e->buildid_len; i++) {
				e->buildid_hex[2 * i] = hex[e->buildid[i] >> 4];
				e->buildid_hex[2 * i + 1] = hex[e->buildid[i] & 15];
			}
			e->buildid_hex[2 * e->buildid_len] = '\0';
			return;
		}
	}
}

static void read_debuglink(ca_elf *e, Elf_Data *d)
{
	const char *name = d->d_buf;
	size_t len;

	if (!d->d_buf || d->d_size < 8)
		return;
	len = strnlen(name, d->d_size);
	if (len == 0 || len >= d->d_size)
		return;
	/* The CRC follows the name, padded to a 4-byte boundary. */
	len = (len + 4) & ~(size_t)3;
	if (len + 4 > d->d_size)
		return;
	e->debuglink = name;
	memcpy(&e->debuglink_crc, (const char *)d->d_buf + len, 4);
}

static int read_symbols(ca_elf *e, Elf *elf, Elf_Scn *scn, const GElf_Shdr *sh, bool dyn,
			size_t *cap, sp_err *err)
{
	Elf_Data *d = elf_getdata(scn, NULL);
	size_t i, n;

	if (!d || sh->sh_entsize == 0)
		return 0;
	n = d->d_size / sizeof(Elf64_Sym);
	for (i = 1; i < n; i++) {
		GElf_Sym s;
		const char *name;
		unsigned type;

		if (!gelf_getsym(d, (int)i, &s))
			break;
		type = GELF_ST_TYPE(s.st_info);
		if ((type != STT_FUNC && type != STT_GNU_IFUNC) || s.st_shndx == SHN_UNDEF ||
		    s.st_value == 0)
			continue;
		name = elf_strptr(elf, sh->sh_link, s.st_name);
		if (!name || !*name)
			continue;
		if (sp_grow((void **)&e->syms, cap, e->nsyms + 1, sizeof *e->syms))
			return sp_fail(err, "%s: out of memory", e->path);
		e->syms[e->nsyms++] = (ca_sym){ .addr = s.st_value, .size = s.st_size, .name = name,
					      .type = (uint8_t)type, .from_dynsym = dyn,
					      .bind = (uint8_t)GELF_ST_BIND(s.st_info) };
	}
	return 0;
}

/* GOT slots filled by the dynamic linker with a named symbol: JUMP_SLOT
 * (.rela.plt) and GLOB_DAT (.rela.dyn, -fno-plt calls and .plt.got). */
static int read_relocs(ca_elf *e, Elf_Scn *scn, const GElf_Shdr *sh, size_t *cap, sp_err *err)
{
	Elf_Data *d = elf_getdata(scn, NULL);
	Elf_Scn *symscn = elf_getscn(e->elf, sh->sh_link);
	GElf_Shdr symsh;
	Elf_Data *symd;
	size_t i, n;

	if (!d || !symscn || !gelf_getshdr(symscn, &symsh))
		return 0;
	symd = elf_getdata(symscn, NULL);
	if (!symd)
		return 0;
	n = d->d_size / sizeof(Elf64_Rela);
	for (i = 0; i < n; i++) {
		GElf_Rela r;
		GElf_Sym s;
		unsigned type;
		const char *name;

		if (!gelf_getrela(d, (int)i, &r))
			break;
		type = GELF_R_TYPE(r.r_info);
		if (type == R_X86_64_RELATIVE) {
			/* Kept to read init/fini arrays in PIE and shared objects. */
			if (sp_grow((void **)&e->relative, &e->caprel, e->nrelative + 1,
				    sizeof *e->relative))
				return sp_fail(err, "%s: out of memory", e->path);
			e->relative[e->nrelative++] = (ca_gotslot){ .addr = r.r_offset,
								   .resolver = (uint64_t)r.r_addend };
			continue;
		}
		if (type == R_X86_64_IRELATIVE) {
			/* Named later, after the symbol at the resolver. */
			if (sp_grow((void **)&e->got, cap, e->ngot + 1, sizeof *e->got))
				return sp_fail(err, "%s: out of memory", e->path);
			e->got[e->ngot++] = (ca_gotslot){ .addr = r.r_offset,
							  .resolver = (uint64_t)r.r_addend };
			continue;
		}
		if (type != R_X86_64_JUMP_SLOT && type != R_X86_64_GLOB_DAT)
			continue;
		if (!gelf_getsym(symd, (int)GELF_R_SYM(r.r_info), &s))
			continue;
		name = elf_strptr(e->elf, symsh.sh_link, s.st_name);
		if (!name || !*name)
			continue;
		if (sp_grow((void **)&e->got, cap, e->ngot + 1, sizeof *e->got))
			return sp_fail(err, "%s: out of memory", e->path);
		e->got[e->ngot++] = (ca_gotslot){ .addr = r.r_offset, .name = name };
	}
	return 0;
}

/*
 * A stripped module's .symtab often survives in its separate debug file
 * (<debug dir>/.build-id/xx/rest.debug, e.g. Debian's libc6-dbg): the names
 * of its local functions are worth having.  Its addresses are the module's.
 * A missing or unreadable debug file only means fewer names.
 */
bool ca_elf_debug_path(const ca_elf *e, const char *debug_dir, char *out, size_t len)
{
	int n;

	if (e->buildid_len < 2)
		return false;
	n = snprintf(out, len, "%s/.build-id/%.2s/%s.debug", debug_dir ? debug_dir : "/usr/lib/debug",
		     e->buildid_hex, e->buildid_hex + 2);
	return n > 0 && (size_t)n < len;
}

static int read_debug_symbols(ca_elf *e, size_t *cap, sp_err *err)
{
	char path[4096];
	Elf_Scn *scn = NULL;
	Elf *elf;
	int fd;

	if (!ca_elf_debug_path(e, e->debug_dir, path, sizeof path))
		return 0;
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
	if (fd < 0)
		return 0;
	elf = elf_begin(fd, ELF_C_READ_MMAP, NULL);
	if (!elf || elf_kind(elf) != ELF_K_ELF || gelf_getclass(elf) != ELFCLASS64) {
		if (elf)
			elf_end(elf);
		close(fd);
		return 0;
	}
	while ((scn = elf_nextscn(elf, scn))) {
		GElf_Shdr sh;

		if (gelf_getshdr(scn, &sh) && sh.sh_type == SHT_SYMTAB &&
		    read_symbols(e, elf, scn, &sh, false, cap, err)) {
			elf_end(elf);
			close(fd);
			return -1;
		}
	}
	e->dbg_elf = elf;       /* the names point into it: kept until ca_elf_close */
	e->dbg_fd = fd;
	return 0;
}

static int cmp_got(const void *a, const void *b)
{
	const ca_gotslot *x = a, *y = b;

	return x->addr < y->addr ? -1 : x->addr > y->addr;
}

/* An IRELATIVE slot holds what the ifunc resolver picks; name it after the
 * resolver's symbol (memcpy, strlen, ...), global names first. */
static void name_irelative(ca_elf *e)
{
	size_t i, j;

	for (i = 0; i < e->ngot; i++) {
		const ca_sym *best = NULL;

		if (e->got[i].name || !e->got[i].resolver)
			continue;
		for (j = 0; j < e->nsyms; j++)
			if (e->syms[j].addr == e->got[i].resolver &&
			    (!best || (best->bind != STB_GLOBAL && e->syms[j].bind == STB_GLOBAL)))
				best = &e->syms[j];
		if (best)
			e->got[i].name = best->name;
	}
}

static int add_entry(ca_elf *e, size_t *cap, uint64_t addr)
{
	if (!addr || addr == UINT64_MAX)
		return 0;
	if (sp_grow((void **)&e->entries, cap, e->nentries + 1, sizeof *e->entries))
		return -1;
	e->entries[e->nentries++] = addr;
	return 0;
}

/*
 * Code that the loader calls: DT_INIT, DT_FINI and every pointer in the
 * init/fini arrays.  In PIE and shared objects the array slots are filled by
 * RELATIVE relocations, whose addends are the pointers.
 */
static int read_entries(ca_elf *e, sp_err *err)
{
	static const char *const arrays[] = { ".init_array", ".fini_array", ".preinit_array" };
	size_t cap = 0;
	Elf_Scn *scn = NULL;
	size_t shstrndx;

	if (elf_getshdrstrndx(e->elf, &shstrndx) != 0)
		return 0;
	while ((scn = elf_nextscn(e->elf, scn))) {
		GElf_Shdr sh;
		const char *name;

		if (!gelf_getshdr(scn, &sh))
			continue;
		name = elf_strptr(e->elf, shstrndx, sh.sh_name);
		if (sh.sh_type == SHT_DYNAMIC) {
			Elf_Data *d = elf_getdata(scn, NULL);
			GElf_Dyn dyn;

			for (int i = 0; d && gelf_getdyn(d, i, &dyn); i++)
				if ((dyn.d_tag == DT_INIT || dyn.d_tag == DT_FINI) &&
				    add_entry(e, &cap, dyn.d_un.d_ptr))
					goto oom;
			continue;
		}
		for (size_t k = 0; name && k < 3; k++) {
			if (strcmp(name, arrays[k]) != 0 || sh.sh_type == SHT_NOBITS ||
			    sh.sh_offset > e->map_size || sh.sh_size > e->map_size - sh.sh_offset)
				continue;
			for (uint64_t off = 0; off + 8 <= sh.sh_size; off += 8) {
				uint64_t v;

				memcpy(&v, e->map + sh.sh_offset + off, 8);
				if (add_entry(e, &cap, v))
					goto oom;
			}
			for (size_t r = 0; r < e->nrelative; r++)
				if (e->relative[r].addr >= sh.sh_addr &&
				    e->relative[r].addr < sh.sh_addr + sh.sh_size &&
				    add_entry(e, &cap, e->relative[r].resolver))
					goto oom;
		}
	}
	return 0;
oom:
	return sp_fail(err, "%s: out of memory", e->path);
}

static int check_header(ca_elf *e, sp_err *err)
{
	GElf_Ehdr eh;

	if (elf_kind(e->elf) != ELF_K_ELF)
		return sp_fail(err, "%s: not an ELF file", e->path);
	if (gelf_getclass(e->elf) != ELFCLASS64)
		return sp_fail(err, "%s: 32-bit ELF is not supported (sptrace analyses x86-64 modules)",
			       e->path);
	if (!gelf_getehdr(e->elf, &eh))
		return sp_fail(err, "%s: unreadable ELF header: %s", e->path, elf_errmsg(-1));
	if (eh.e_machine != EM_X86_64)
		return sp_fail(err, "%s: ELF machine %u is not x86-64; sptrace analyses x86-64 modules",
			       e->path, eh.e_machine);
	if (eh.e_type != ET_EXEC && eh.e_type != ET_DYN)
		return sp_fail(err, "%s: ELF type %u is neither an executable nor a shared object",
			       e->path, eh.e_type);
	/* libelf quietly gives fewer sections for a cut file; say what is wrong. */
	if (eh.e_shoff > e->map_size ||
	    (uint64_t)eh.e_shnum * eh.e_shentsize > e->map_size - eh.e_shoff)
		return sp_fail(err, "%s: truncated or corrupt: the section headers (offset %llu, "
			       "%u x %u bytes) extend past the end of the file (%zu bytes)", e->path,
			       (unsigned long long)eh.e_shoff, eh.e_shnum, eh.e_shentsize, e->map_size);
	if (eh.e_phoff > e->map_size ||
	    (uint64_t)eh.e_phnum * eh.e_phentsize > e->map_size - eh.e_phoff)
		return sp_fail(err, "%s: truncated or corrupt: the program headers (offset %llu, "
			       "%u x %u bytes) extend past the end of the file (%zu bytes)", e->path,
			       (unsigned long long)eh.e_phoff, eh.e_phnum, eh.e_phentsize, e->map_size);
	e->e_type = eh.e_type;
	e->entry = eh.e_entry;
	return 0;
}

static int map_file(ca_elf *e, const char *path, sp_err *err)
{
	struct stat st;

	e->fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);  /* a FIFO must not hang us */
	if (e->fd < 0)
		return sp_fail(err, "%s: cannot open: %s", path, strerror(errno));
	if (fstat(e->fd, &st) < 0)
		return sp_fail(err, "%s: cannot stat: %s", path, strerror(errno));
	if (S_ISDIR(st.st_mode))
		return sp_fail(err, "%s: is a directory, not an ELF file", path);
	if (!S_ISREG(st.st_mode))
		return sp_fail(err, "%s: not a regular file", path);
	/* The verdict on the very file mapped below (trust.c). */
	ca_file_trust(&st, e->untrusted, sizeof e->untrusted);
	ca_file_id(&st, e->file_id);
	if (st.st_size < (off_t)sizeof(Elf64_Ehdr))
		return sp_fail(err, "%s: too short to be an ELF file (%lld bytes)", path,
			       (long long)st.st_size);
	e->map_size = (size_t)st.st_size;
	e->map = mmap(NULL, e->map_size, PROT_READ, MAP_PRIVATE, e->fd, 0);
	if (e->map == MAP_FAILED) {
		e->map = NULL;
		return sp_fail(err, "%s: cannot map: %s", path, strerror(errno));
	}
	return 0;
}

int ca_elf_open(ca_elf *e, const char *path, const char *debug_dir, sp_err *err)
{
	size_t shstrndx, capsec = 0, capsym = 0, capgot = 0;
	Elf_Scn *scn = NULL;
	bool has_symtab = false;

	memset(e, 0, sizeof *e);
	e->fd = -1;
	e->path = path;
	e->debug_dir = debug_dir && *debug_dir ? debug_dir : NULL;
	if (map_file(e, path, err))
		return -1;
	elf_version(EV_CURRENT);
	e->elf = elf_memory((char *)e->map, e->map_size);
	if (!e->elf)
		return sp_fail(err, "%s: libelf cannot read it: %s", path, elf_errmsg(-1));
	if (check_header(e, err))
		return -1;
	if (elf_getshdrstrndx(e->elf, &shstrndx) != 0)
		return sp_fail(err, "%s: no section header string table: %s", path, elf_errmsg(-1));
	while ((scn = elf_nextscn(e->elf, scn))) {
		GElf_Shdr sh;
		const char *name;

		if (!gelf_getshdr(scn, &sh))
			return sp_fail(err, "%s: bad section header: %s", path, elf_errmsg(-1));
		name = elf_strptr(e->elf, shstrndx, sh.sh_name);
		if (!name)
			name = "";
		if (keep_section(name, &sh) && add_section(e, &capsec, name, &sh, err))
			return -1;
		if (sh.sh_type == SHT_SYMTAB || sh.sh_type == SHT_DYNSYM) {
			if (read_symbols(e, e->elf, scn, &sh, sh.sh_type == SHT_DYNSYM, &capsym, err))
				return -1;
			if (sh.sh_type == SHT_SYMTAB)
				has_symtab = true;
		} else if (sh.sh_type == SHT_RELA && (sh.sh_flags & SHF_ALLOC)) {
			if (read_relocs(e, scn, &sh, &capgot, err))
				return -1;
		} else if (sh.sh_type == SHT_NOTE && !e->buildid_len) {
			Elf_Data *d = elf_getdata(scn, NULL);
			if (d)
				read_buildid(e, d);
		} else if (strcmp(name, ".gnu_debuglink") == 0) {
			Elf_Data *d = elf_getdata(scn, NULL);
			if (d)
				read_debuglink(e, d);
		}
	}
	{
		size_t nexec = 0;

		for (size_t i = 0; i < e->nsecs; i++)
			nexec += e->secs[i].exec;
		if (nexec == 0)
			return sp_fail(err, "%s: no code sections with contents (truncated, corrupt, "
				       "or a debug-info-only file)", path);
	}
	if (!has_symtab && read_debug_symbols(e, &capsym, err))
		return -1;
	name_irelative(e);
	if (e->ngot)
		qsort(e->got, e->ngot, sizeof *e->got, cmp_got);
	return read_entries(e, err);
}

void ca_elf_close(ca_elf *e)
{
	if (e->dbg_elf)
		elf_end(e->dbg_elf);
	if (e->dbg_fd > 0)
		close(e->dbg_fd);
	if (e->elf)
		elf_end(e->elf);
	if (e->map)
		munmap(e->map, e->map_size);
	if (e->fd >= 0)
		close(e->fd);
	free(e->secs);
	free(e->syms);
	free(e->got);
	free(e->entries);
	free(e->relative);
	free(e->fdes);
	free(e->pads);
	memset(e, 0, sizeof *e);
	e->fd = -1;
}

const ca_section *ca_elf_section_at(const ca_elf *e, uint64_t addr)
{
	size_t i;

	for (i = 0; i < e->nsecs; i++)
		if (addr >= e->secs[i].addr && addr - e->secs[i].addr < e->secs[i].size)
			return &e->secs[i];
	return NULL;
}

const ca_section *ca_elf_section_named(const ca_elf *e, const char *name)
{
	size_t i;

	for (i = 0; i < e->nsecs; i++)
		if (strcmp(e->secs[i].name, name) == 0)
			return &e->secs[i];
	return NULL;
}

bool ca_elf_read(const ca_elf *e, uint64_t addr, void *buf, size_t n)
{
	const ca_section *s = ca_elf_section_at(e, addr);

	if (!s || !s->data || s->size - (addr - s->addr) < n)
		return false;
	memcpy(buf, s->data + (addr - s->addr), n);
	return true;
}

const char *ca_elf_got_name(const ca_elf *e, uint64_t slot)
{
	size_t lo = 0, hi = e->ngot;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (e->got[mid].addr < slot)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < e->ngot && e->got[lo].addr == slot ? e->got[lo].name : NULL;
}
