/*
 * lines.c — the module's source line table, read from DWARF with libdwarf
 * (Debian bookworm's 20210528 API), from the module itself or from its
 * separate debug file.
 *
 * The result is m->lines: one ca_line {addr, file, line} per address where
 * the source position changes, sorted by address, so that the row in effect
 * at an address is the last row at or below it.  A row with line 0 (and
 * file "") marks the end of a DWARF sequence: addresses from there up to the
 * next row have no source line.
 *
 * "No DWARF anywhere" is not an error (0, no lines); a DWARF file that
 * libdwarf cannot read is (-1, "<file>: DWARF line table: <why>"), and so
 * is, for root, a debug file another user could have planted (planted()).
 * libdwarf runs in a sandboxed child (ca_lines_read, sandbox.c).
 */
#include <dwarf.h>
#include <errno.h>
#include <fcntl.h>
#include <gelf.h>
#include <libdwarf.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include "ca_internal.h"

#define DEFAULT_DEBUG_DIR "/usr/lib/debug"

/* Linkers resolve references from .debug_line to functions they discarded
 * (COMDAT duplicates, --gc-sections) to 0 (GNU ld, gold) or to a tombstone
 * (lld: -1, or -2 in some sections).  Such sequences describe no code. */
#define TOMBSTONE_MIN (UINT64_MAX - 1)

/* A row as read, before sorting; `ord` keeps the table order for ties. */
typedef struct raw_row {
	uint64_t addr;
	uint32_t file;   /* string offset; 0 ("") with line 0 for a terminator */
	uint32_t line;
	uint32_t ord;
} raw_row;

/* Open-addressing set of file-name strings already in m->strs, so that each
 * distinct path is stored once however many CUs name it.  Slots hold string
 * offsets (m->strs may move when it grows); CA_NONE marks an empty slot. */
typedef struct str_set {
	uint32_t *off;
	uint32_t *hash;
	size_t cap, n;
} str_set;

/* Open-addressing set of .debug_line offsets already read (type units and
 * dwz partial units share their CU's table; reading it twice would double
 * every row). */
typedef struct off_set {
	uint64_t *key;   /* offset + 1; 0 marks an empty slot */
	size_t cap, n;
} off_set;

typedef struct line_reader {
	ca_module *m;
	const char *path;      /* the DWARF file, for messages */
	int fd;                /* the DWARF file, opened before the sandbox */
	Dwarf_Debug dbg;
	bool zero_is_code;     /* an executable section covers address 0 */
	raw_row *rows;
	size_t nrows, caprows;
	uint32_t *runs;        /* index of the first row of each sequence */
	size_t nruns, capruns;
	str_set files;
	off_set tables;
	uint32_t *cu_file;     /* this CU's file index -> string offset */
	size_t cap_cu_file;
	char *join;            /* scratch for comp_dir + "/" + name */
	size_t cap_join;
	/* Raw .debug_line, read with libelf for DWARF 5 file numbers (see
	 * v5_row_files) from lr->fd; loaded on first use. */
	bool sec_tried;
	Elf *sec_elf;
	const uint8_t *sec;
	size_t sec_size;
	uint32_t *row_file;    /* scratch: true file register of each row */
	size_t cap_row_file;
	sp_err *err;
} line_reader;

static int dw_fail(line_reader *lr, Dwarf_Error derr, const char *what)
{
	sp_fail(lr->err, "%s: DWARF line table: %s: %s", lr->path, what,
		derr ? dwarf_errmsg(derr) : "unknown libdwarf error");
	if (derr)
		dwarf_dealloc(lr->dbg, derr, DW_DLA_ERROR);
	return -1;
}

static int oom(line_reader *lr)
{
	return sp_fail(lr->err, "%s: DWARF line table: out of memory", lr->path);
}

/* ---- string and offset sets ---------------------------------------- */

static uint32_t fnv1a(const char *s)
{
	uint32_t h = 2166136261u;

	for (; *s; s++)
		h = (h ^ (uint8_t)*s) * 16777619u;
	return h;
}

static int str_set_grow(str_set *set)
{
	size_t ncap = set->cap ? set->cap * 2 : 256;
	uint32_t *off = malloc(ncap * sizeof *off);
	uint32_t *hash = malloc(ncap * sizeof *hash);

	if (!off || !hash) {
		free(off);
		free(hash);
		return -1;
	}
	memset(off, 0xff, ncap * sizeof *off);
	for (size_t i = 0; i < set->cap; i++) {
		size_t j;

		if (set->off[i] == CA_NONE)
			continue;
		for (j = set->hash[i] & (ncap - 1); off[j] != CA_NONE; j = (j + 1) & (ncap - 1))
			;
		off[j] = set->off[i];
		hash[j] = set->hash[i];
	}
	free(set->off);
	free(set->hash);
	set->off = off;
	set->hash = hash;
	set->cap = ncap;
	return 0;
}

/* The string offset of `s`, adding it to m->strs the first time. */
static uint32_t intern(line_reader *lr, const char *s)
{
	str_set *set = &lr->files;
	uint32_t h = fnv1a(s), off;
	size_t j;

	if (!*s)
		return 0;
	if ((set->n + 1) * 2 > set->cap && str_set_grow(set) < 0)
		return CA_NONE;
	for (j = h & (set->cap - 1); set->off[j] != CA_NONE; j = (j + 1) & (set->cap - 1))
		if (set->hash[j] == h && strcmp(lr->m->strs + set->off[j], s) == 0)
			return set->off[j];
	off = ca_str_add(lr->m, s);
	if (off == CA_NONE)
		return CA_NONE;
	set->off[j] = off;
	set->hash[j] = h;
	set->n++;
	return off;
}

/* 1 if `off` was already in the set, 0 if it was added, -1 on ENOMEM. */
static int off_set_add(off_set *set, uint64_t off)
{
	uint64_t key = off + 1;
	size_t j;

	if ((set->n + 1) * 2 > set->cap) {
		size_t ncap = set->cap ? set->cap * 2 : 256;
		uint64_t *nk = calloc(ncap, sizeof *nk);

		if (!nk)
			return -1;
		for (size_t i = 0; i < set->cap; i++) {
			if (!set->key[i])
				continue;
			for (j = (set->key[i] * 0x9e3779b97f4a7c15u >> 32) & (ncap - 1);
			     nk[j]; j = (j + 1) & (ncap - 1))
				;
			nk[j] = set->key[i];
		}
		free(set->key);
		set->key = nk;
		set->cap = ncap;
	}
	for (j = (key * 0x9e3779b97f4a7c15u >> 32) & (set->cap - 1); set->key[j];
	     j = (j + 1) & (set->cap - 1))
		if (set->key[j] == key)
			return 1;
	set->key[j] = key;
	set->n++;
	return 0;
}

/* ---- file names ------------------------------------------------------ */

/*
 * Tidy a path lexically: drop "." components and fold "dir/.." pairs, so
 * that "./csu/../malloc/malloc.c" (glibc's comp_dir "./csu" + a relative
 * name) reads "malloc/malloc.c".  Leading ".." components are kept.
 */
static void tidy_path(char *p)
{
	bool abs = *p == '/';
	char *out = p + abs, *in = p + abs;
	size_t keep = abs;  /* bytes of p that a ".." may not remove */

	for (bool last = !*in; !last;) {
		size_t len = strcspn(in, "/");
		char *next = in + len + (in[len] == '/');

		last = !*next;
		if (len == 0 || (len == 1 && in[0] == '.')) {
			/* drop "" and "." */
		} else if (len == 2 && in[0] == '.' && in[1] == '.' &&
			   (size_t)(out - p) > keep) {
			/* fold with the previous component: back over "name/" */
			out--;
			while (out > p + keep && out[-1] != '/')
				out--;
		} else if (len == 2 && in[0] == '.' && in[1] == '.' && abs) {
			/* "/.." is "/" */
		} else {
			/* out <= in: writing "name/" may clobber in's terminator,
			 * which `last` has already recorded. */
			memmove(out, in, len);
			out += len;
			*out++ = '/';
			if (len == 2 && in[0] == '.' && in[1] == '.')
				keep = (size_t)(out - p);
		}
		in = next;
	}
	if (out > p + abs && out[-1] == '/')
		out--;
	if (out == p)
		*out++ = abs ? '/' : '.';
	*out = '\0';
}

/* What a CU's rows need to name their files. */
typedef struct cu_files {
	Dwarf_Line_Context ctx;
	Dwarf_Unsigned version;   /* of the line table */
	const char *comp_dir;     /* DW_AT_comp_dir, may be NULL or relative */
	Dwarf_Signed end;         /* file indexes are < end */
	const uint32_t *row_file; /* file of each row if libdwarf's is unreliable */
} cu_files;

/* Set lr->join to "a/b", or to "b" when a is NULL; b may be lr->join. */
static int join2(line_reader *lr, const char *a, const char *b)
{
	bool b_is_join = b == lr->join;
	size_t la = a ? strlen(a) : 0, lb = strlen(b);

	if (sp_grow((void **)&lr->join, &lr->cap_join, la + lb + 2, 1) < 0)
		return -1;
	if (b_is_join)
		b = lr->join;  /* it may have moved */
	if (la) {
		memmove(lr->join + la + 1, b, lb + 1);
		memcpy(lr->join, a, la);
		lr->join[la] = '/';
	} else if (!b_is_join) {
		memcpy(lr->join, b, lb + 1);
	}
	return 0;
}

/*
 * The path of file `fileno` of the CU's line table: name, under its include
 * directory, under comp_dir while still relative.  Done here rather than
 * with dwarf_linesrc because libdwarf 20210528 prefixes comp_dir twice
 * when a DWARF 5 table's directory 0 (which *is* comp_dir) is relative:
 * glibc's "./csu" + "init-first.c" would read "./csu/./csu/init-first.c".
 * Directory indexes are raw (DWARF 5: 0 = comp_dir; DWARF 4: 0 = comp_dir,
 * 1.. = include_directories), as dwarf_srclines_include_dir_data takes them.
 */
static uint32_t file_path(line_reader *lr, const cu_files *cu, Dwarf_Unsigned fileno)
{
	Dwarf_Error derr = NULL;
	const char *name = NULL, *dir = NULL;
	Dwarf_Unsigned dirindex = 0, mtime, flen;
	Dwarf_Form_Data16 *md5 = NULL;
	bool dir_is_comp_dir;
	int res;

	res = dwarf_srclines_files_data_b(cu->ctx, (Dwarf_Signed)fileno, &name, &dirindex,
					  &mtime, &flen, &md5, &derr);
	if (res != DW_DLV_OK || !name) {
		/* A row naming no valid file (file 0 in DWARF 4, an index past
		 * the table) still gives a useful address range: file "". */
		if (res == DW_DLV_ERROR)
			dwarf_dealloc(lr->dbg, derr, DW_DLA_ERROR);
		return 0;
	}
	dir_is_comp_dir = dirindex == 0;
	if (name[0] != '/' && (cu->version >= 5 || dirindex > 0)) {
		res = dwarf_srclines_include_dir_data(cu->ctx, (Dwarf_Signed)dirindex, &dir, &derr);
		if (res == DW_DLV_ERROR)
			dwarf_dealloc(lr->dbg, derr, DW_DLA_ERROR);
		if (res != DW_DLV_OK)
			dir = NULL;
	}
	/* DWARF 5's directory 0 repeats comp_dir: do not prefix it twice. */
	if (dir_is_comp_dir && dir && cu->comp_dir && strcmp(dir, cu->comp_dir) != 0)
		dir_is_comp_dir = false;
	if (join2(lr, name[0] == '/' ? NULL : dir, name) < 0)
		return CA_NONE;
	if (lr->join[0] != '/' && cu->comp_dir && !(dir_is_comp_dir && dir) &&
	    join2(lr, cu->comp_dir, lr->join) < 0)
		return CA_NONE;
	tidy_path(lr->join);
	return intern(lr, lr->join);
}

/* ---- DWARF 5 file numbers --------------------------------------------- */

/*
 * libdwarf 20210528 starts every DWARF 5 sequence with the file register at
 * 0, where DWARF 5 (6.2.2) says 1.  Rows before a sequence's first
 * DW_LNS_set_file thus name file 0 (the primary source) instead of file 1:
 * every function gcc emits in its own section from a header (C++ inline
 * functions and templates) and clang's header functions would be credited
 * to the .c/.cpp file.  dwarf_linesrc has the same fault.  So for DWARF 5
 * tables the file register is recomputed here by walking the table's
 * opcodes, one value per row in libdwarf's order; if the walk disagrees
 * with libdwarf on the number of rows, libdwarf's numbers are used.
 */

static bool get_uleb(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
	uint64_t r = 0;
	unsigned shift = 0;

	while (*p < end) {
		uint8_t b = *(*p)++;

		if (shift < 64)
			r |= (uint64_t)(b & 0x7f) << shift;
		shift += 7;
		if (!(b & 0x80)) {
			*v = r;
			return true;
		}
	}
	return false;
}

static bool get_fixed(const uint8_t **p, const uint8_t *end, unsigned n, uint64_t *v)
{
	uint64_t r = 0;

	if ((size_t)(end - *p) < n)
		return false;
	for (unsigned i = 0; i < n; i++)   /* x86-64: little endian */
		r |= (uint64_t)(*p)[i] << (8 * i);
	*p += n;
	*v = r;
	return true;
}

static void load_line_section(line_reader *lr)
{
	Elf_Scn *scn = NULL;
	size_t shstrndx;

	lr->sec_tried = true;
	lr->sec_elf = elf_begin(lr->fd, ELF_C_READ_MMAP, NULL);
	if (!lr->sec_elf || elf_getshdrstrndx(lr->sec_elf, &shstrndx) != 0)
		return;
	while ((scn = elf_nextscn(lr->sec_elf, scn)) != NULL) {
		GElf_Shdr sh;
		const char *name;
		Elf_Data *d;

		if (!gelf_getshdr(scn, &sh) || sh.sh_type == SHT_NOBITS)
			continue;
		name = elf_strptr(lr->sec_elf, shstrndx, sh.sh_name);
		if (!name)
			continue;
		if (strcmp(name, ".debug_line") == 0) {
			if ((sh.sh_flags & SHF_COMPRESSED) && elf_compress(scn, 0, 0) < 0)
				return;
		} else if (strcmp(name, ".zdebug_line") == 0) {
			if (elf_compress_gnu(scn, 0, 0) < 0)
				return;
		} else {
			continue;
		}
		d = elf_getdata(scn, NULL);
		if (d && d->d_buf) {
			lr->sec = d->d_buf;
			lr->sec_size = d->d_size;
		}
		return;
	}
}

/* The file register of each of the `nrows` rows of the DWARF 5 line table
 * at `off`, or NULL when the table cannot be walked to the same rows. */
static const uint32_t *v5_row_files(line_reader *lr, uint64_t off, Dwarf_Signed nrows)
{
	const uint8_t *p, *end, *prog;
	uint64_t len, version, hdr_len, v;
	uint8_t opcode_base;
	const uint8_t *std_len;
	unsigned offsize = 4;
	uint64_t file = 1;
	size_t row = 0;

	if (!lr->sec_tried)
		load_line_section(lr);
	if (!lr->sec || off >= lr->sec_size || nrows <= 0)
		return NULL;
	if (sp_grow((void **)&lr->row_file, &lr->cap_row_file, (size_t)nrows,
		    sizeof *lr->row_file) < 0)
		return NULL;
	p = lr->sec + off;
	end = lr->sec + lr->sec_size;
	if (!get_fixed(&p, end, 4, &len))
		return NULL;
	if (len == 0xffffffff) {
		offsize = 8;
		if (!get_fixed(&p, end, 8, &len))
			return NULL;
	}
	if (len > (uint64_t)(end - p))
		return NULL;
	end = p + len;
	/* version, address_size, segment_selector_size, header_length */
	if (!get_fixed(&p, end, 2, &version) || version != 5 || end - p < 2)
		return NULL;
	p += 2;
	if (!get_fixed(&p, end, offsize, &hdr_len) || hdr_len > (uint64_t)(end - p))
		return NULL;
	prog = p + hdr_len;
	/* minimum_instruction_length, maximum_operations_per_instruction,
	 * default_is_stmt, line_base, line_range, opcode_base */
	if (end - p < 6)
		return NULL;
	opcode_base = p[5];
	p += 6;
	std_len = p;
	if (opcode_base == 0 || prog < p || (size_t)(prog - p) < (size_t)opcode_base - 1)
		return NULL;

	for (p = prog; p < end;) {
		uint8_t op = *p++;

		if (op >= opcode_base || op == 1) {          /* special, DW_LNS_copy */
			if (row >= (size_t)nrows)
				return NULL;
			lr->row_file[row++] = file > UINT32_MAX ? UINT32_MAX : (uint32_t)file;
		} else if (op == 0) {                         /* extended */
			const uint8_t *next;

			if (!get_uleb(&p, end, &len) || len == 0 || len > (uint64_t)(end - p))
				return NULL;
			next = p + len;
			if (*p == 1) {                        /* DW_LNE_end_sequence */
				if (row >= (size_t)nrows)
					return NULL;
				lr->row_file[row++] = file > UINT32_MAX ? UINT32_MAX : (uint32_t)file;
				file = 1;
			}
			p = next;
		} else if (op == 4) {                         /* DW_LNS_set_file */
			if (!get_uleb(&p, end, &file))
				return NULL;
		} else if (op == 9) {                         /* DW_LNS_fixed_advance_pc */
			if (!get_fixed(&p, end, 2, &v))
				return NULL;
		} else {
			/* other standard opcodes: as many ULEB operands as the
			 * header says (advance_pc 1, advance_line 1 SLEB, ...) */
			for (unsigned k = 0; k < std_len[op - 1]; k++)
				if (!get_uleb(&p, end, &v))
					return NULL;
		}
	}
	return row == (size_t)nrows ? lr->row_file : NULL;
}

/* ---- one compilation unit -------------------------------------------- */

static int push_row(line_reader *lr, uint64_t addr, uint32_t file, uint32_t line)
{
	raw_row *r;

	if (lr->nrows >= UINT32_MAX)
		return 0;
	if (sp_grow((void **)&lr->rows, &lr->caprows, lr->nrows + 1, sizeof *lr->rows) < 0)
		return oom(lr);
	r = &lr->rows[lr->nrows];
	r->addr = addr;
	r->file = file;
	r->line = line;
	r->ord = (uint32_t)lr->nrows++;
	return 0;
}

static int start_run(line_reader *lr)
{
	if (sp_grow((void **)&lr->runs, &lr->capruns, lr->nruns + 1, sizeof *lr->runs) < 0)
		return oom(lr);
	lr->runs[lr->nruns++] = (uint32_t)lr->nrows;
	return 0;
}

/* End the current sequence at `addr`.  Rows of this sequence at that very
 * address cover no bytes (gcc often repeats the last line there): they are
 * dropped, so that the terminator, not a zero-length row, is in effect. */
static int end_run(line_reader *lr, uint64_t addr)
{
	uint32_t first = lr->runs[lr->nruns - 1];

	while (lr->nrows > first && lr->rows[lr->nrows - 1].addr == addr)
		lr->nrows--;
	return push_row(lr, addr, 0, 0);
}

static bool discarded(const line_reader *lr, uint64_t seq_start)
{
	return (seq_start == 0 && !lr->zero_is_code) || seq_start >= TOMBSTONE_MIN;
}

/* Append the rows of one line table.  A sequence that starts at address 0
 * or at a tombstone is skipped whole; an end_sequence row becomes a
 * terminator (line 0) so that the last real row does not extend past it. */
static int read_rows(line_reader *lr, const cu_files *cu, Dwarf_Line *lines, Dwarf_Signed n)
{
	Dwarf_Error derr = NULL;
	bool in_seq = false, skip = false;

	for (Dwarf_Signed i = 0; i < n; i++) {
		Dwarf_Bool end = 0;
		Dwarf_Addr addr = 0;
		Dwarf_Unsigned lineno = 0, fileno = 0;
		uint32_t file;

		if (dwarf_lineendsequence(lines[i], &end, &derr) != DW_DLV_OK ||
		    dwarf_lineaddr(lines[i], &addr, &derr) != DW_DLV_OK)
			return dw_fail(lr, derr, "reading a row");
		if (end) {
			if (in_seq && !skip && end_run(lr, addr) < 0)
				return -1;
			in_seq = skip = false;
			continue;
		}
		if (!in_seq) {
			in_seq = true;
			skip = discarded(lr, addr);
			if (!skip && start_run(lr) < 0)
				return -1;
		}
		if (skip)
			continue;
		if (dwarf_lineno(lines[i], &lineno, &derr) != DW_DLV_OK)
			return dw_fail(lr, derr, "reading a row");
		if (cu->row_file)
			fileno = cu->row_file[i];
		else if (dwarf_line_srcfileno(lines[i], &fileno, &derr) != DW_DLV_OK)
			return dw_fail(lr, derr, "reading a row");
		/* Each file index is resolved once per CU. */
		if (fileno < (Dwarf_Unsigned)cu->end && lr->cu_file[fileno] != CA_NONE) {
			file = lr->cu_file[fileno];
		} else {
			file = file_path(lr, cu, fileno);
			if (file == CA_NONE)
				return oom(lr);
			if (fileno < (Dwarf_Unsigned)cu->end)
				lr->cu_file[fileno] = file;
		}
		if (push_row(lr, addr, file, lineno > UINT32_MAX ? UINT32_MAX : (uint32_t)lineno) < 0)
			return -1;
	}
	return 0;
}

static int read_cu(line_reader *lr, Dwarf_Die cu_die)
{
	Dwarf_Error derr = NULL;
	Dwarf_Unsigned table_off = 0;
	Dwarf_Small table_count = 0;
	Dwarf_Line *lines = NULL;
	Dwarf_Signed nlines = 0, base = 0, count = 0;
	cu_files cu = { 0 };
	bool have_off;
	int res, ret = -1;

	res = dwarf_srclines_b(cu_die, &cu.version, &table_count, &cu.ctx, &derr);
	if (res == DW_DLV_NO_ENTRY)
		return 0;       /* a CU without DW_AT_stmt_list */
	if (res != DW_DLV_OK)
		return dw_fail(lr, derr, "reading a line table header");

	/* 0: header without rows; 2: the experimental two-level tables that
	 * no mainstream compiler emits. */
	if (table_count != 1) {
		ret = 0;
		goto out;
	}
	res = dwarf_srclines_table_offset(cu.ctx, &table_off, &derr);
	if (res == DW_DLV_ERROR) {
		dw_fail(lr, derr, "reading a line table header");
		goto out;
	}
	have_off = res == DW_DLV_OK;
	if (have_off) {
		res = off_set_add(&lr->tables, table_off);
		if (res < 0) {
			oom(lr);
			goto out;
		}
		if (res == 1) {
			ret = 0;
			goto out;
		}
	}
	res = dwarf_srclines_comp_dir(cu.ctx, &cu.comp_dir, &derr);
	if (res == DW_DLV_ERROR) {
		dw_fail(lr, derr, "reading the compilation directory");
		goto out;
	}
	if (res != DW_DLV_OK || (cu.comp_dir && !cu.comp_dir[0]))
		cu.comp_dir = NULL;
	res = dwarf_srclines_files_indexes(cu.ctx, &base, &count, &cu.end, &derr);
	if (res == DW_DLV_ERROR) {
		dw_fail(lr, derr, "reading the file table");
		goto out;
	}
	if (res != DW_DLV_OK || cu.end < 0 || cu.end > 1 << 20)
		cu.end = 0;
	if (sp_grow((void **)&lr->cu_file, &lr->cap_cu_file, (size_t)cu.end + 1,
		    sizeof *lr->cu_file) < 0) {
		oom(lr);
		goto out;
	}
	memset(lr->cu_file, 0xff, ((size_t)cu.end + 1) * sizeof *lr->cu_file);

	res = dwarf_srclines_from_linecontext(cu.ctx, &lines, &nlines, &derr);
	if (res == DW_DLV_ERROR) {
		dw_fail(lr, derr, "reading rows");
		goto out;
	}
	if (res == DW_DLV_OK && cu.version == 5 && have_off)
		cu.row_file = v5_row_files(lr, table_off, nlines);
	if (res == DW_DLV_OK && read_rows(lr, &cu, lines, nlines) < 0)
		goto out;
	ret = 0;
out:
	dwarf_srclines_dealloc_b(cu.ctx);
	return ret;
}

static int read_all_cus(line_reader *lr)
{
	for (;;) {
		Dwarf_Error derr = NULL;
		Dwarf_Unsigned hdr_len = 0, typeoff = 0, next = 0;
		Dwarf_Half version = 0, addr_size = 0, len_size = 0, ext_size = 0, cu_type = 0;
		Dwarf_Off abbrev = 0;
		Dwarf_Sig8 sig;
		Dwarf_Die die = NULL;
		int res;

		res = dwarf_next_cu_header_d(lr->dbg, true, &hdr_len, &version, &abbrev,
					     &addr_size, &len_size, &ext_size, &sig,
					     &typeoff, &next, &cu_type, &derr);
		if (res == DW_DLV_NO_ENTRY)
			return 0;
		if (res != DW_DLV_OK)
			return dw_fail(lr, derr, "reading a unit header");
		res = dwarf_siblingof_b(lr->dbg, NULL, true, &die, &derr);
		if (res == DW_DLV_NO_ENTRY)
			continue;
		if (res != DW_DLV_OK)
			return dw_fail(lr, derr, "reading a unit DIE");
		res = read_cu(lr, die);
		dwarf_dealloc_die(die);
		if (res < 0)
			return -1;
	}
}

/* ---- sorting and output ---------------------------------------------- */

static int cmp_row(const void *a, const void *b)
{
	const raw_row *x = a, *y = b;

	if (x->addr != y->addr)
		return x->addr < y->addr ? -1 : 1;
	return x->ord < y->ord ? -1 : x->ord > y->ord;
}

typedef struct run_key {
	uint64_t addr;         /* of the first row */
	uint32_t first, end;   /* rows [first, end) */
} run_key;

static int cmp_run(const void *a, const void *b)
{
	const run_key *x = a, *y = b;

	if (x->addr != y->addr)
		return x->addr < y->addr ? -1 : 1;
	return x->first < y->first ? -1 : x->first > y->first;
}

/*
 * Put lr->rows in (address, table order) order.  Each DWARF sequence is
 * already sorted and sequences rarely overlap, so sorting the few thousand
 * sequences and concatenating them is enough; the general row sort is the
 * fallback for overlapping or unsorted sequences.  Returns the sorted rows
 * (lr->rows itself or a new array), NULL on ENOMEM.
 */
static raw_row *sorted_rows(line_reader *lr)
{
	raw_row *r = lr->rows, *out;
	size_t n = lr->nrows, nruns = lr->nruns, k = 0;
	run_key *keys;
	bool ok = true;

	keys = malloc((nruns ? nruns : 1) * sizeof *keys);
	if (!keys)
		return NULL;
	for (size_t i = 0; i < nruns; i++) {
		keys[i].first = lr->runs[i];
		keys[i].end = i + 1 < nruns ? lr->runs[i + 1] : (uint32_t)n;
		keys[i].addr = r[keys[i].first].addr;
		for (size_t j = keys[i].first + 1; ok && j < keys[i].end; j++)
			ok = r[j - 1].addr <= r[j].addr;
	}
	if (ok) {
		qsort(keys, nruns, sizeof *keys, cmp_run);
		/* A run may end (with its terminator) where the next begins. */
		for (size_t i = 1; ok && i < nruns; i++)
			ok = r[keys[i - 1].end - 1].addr <= keys[i].addr;
	}
	if (!ok) {
		free(keys);
		qsort(r, n, sizeof *r, cmp_row);
		return r;
	}
	out = malloc((n ? n : 1) * sizeof *out);
	if (out)
		for (size_t i = 0; i < nruns; i++) {
			memcpy(out + k, r + keys[i].first,
			       (keys[i].end - keys[i].first) * sizeof *out);
			k += keys[i].end - keys[i].first;
		}
	free(keys);
	return out;
}

/*
 * Sort by address and keep one row per address: the last real row in table
 * order (what addr2line and gdb report: with gcc's location views several
 * rows share an address and the last one is in effect when the instruction
 * runs); a terminator only if no real row has that address (one sequence
 * ending where the next begins).  Then drop rows that repeat the previous
 * row's file and line: lookups give the same answer without them.
 */
static int emit_rows(line_reader *lr)
{
	ca_module *m = lr->m;
	raw_row *r;
	size_t n = lr->nrows, out = 0;

	if (sp_grow((void **)&m->lines, &m->caplines, n ? n : 1, sizeof *m->lines) < 0)
		return oom(lr);
	r = sorted_rows(lr);
	if (!r)
		return oom(lr);
	for (size_t i = 0; i < n;) {
		size_t j = i, pick = i;

		for (; j < n && r[j].addr == r[i].addr; j++)
			if (r[j].line || r[j].file || !(r[pick].line || r[pick].file))
				pick = j;
		i = j;
		if (out == 0 && !r[pick].line && !r[pick].file)
			continue;       /* a terminator with nothing before it */
		if (out && m->lines[out - 1].file == r[pick].file &&
		    m->lines[out - 1].line == r[pick].line)
			continue;
		m->lines[out].addr = r[pick].addr;
		m->lines[out].file = r[pick].file;
		m->lines[out].line = r[pick].line;
		out++;
	}
	if (r != lr->rows)
		free(r);
	m->nlines = out;
	m->stats.nlines = (uint32_t)out;
	return 0;
}

/* ---- finding the DWARF file ------------------------------------------ */

/* `path` opened for reading if it is a regular file, else -1.  O_NONBLOCK:
 * a FIFO planted where a debug file is looked for must not block the open;
 * it is then refused as not regular. */
static int open_regular(const char *path)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
	struct stat st;

	if (fd < 0)
		return -1;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		close(fd);
		return -1;
	}
	return fd;
}

/* Whether the ELF file open on `fd` has a .debug_line (or .zdebug_line)
 * that has bytes.  Decided from the section headers, before libdwarf sees
 * the file, so that "no DWARF here" is never confused with "corrupt DWARF". */
static bool has_debug_line(int fd)
{
	Elf *elf;
	Elf_Scn *scn = NULL;
	size_t shstrndx;
	bool found = false;

	elf_version(EV_CURRENT);
	elf = elf_begin(fd, ELF_C_READ_MMAP, NULL);
	if (elf && elf_kind(elf) == ELF_K_ELF && elf_getshdrstrndx(elf, &shstrndx) == 0) {
		while (!found && (scn = elf_nextscn(elf, scn)) != NULL) {
			GElf_Shdr sh;
			const char *name;

			if (!gelf_getshdr(scn, &sh) || sh.sh_type == SHT_NOBITS || sh.sh_size == 0)
				continue;
			name = elf_strptr(elf, shstrndx, sh.sh_name);
			found = name && (strcmp(name, ".debug_line") == 0 ||
					 strcmp(name, ".zdebug_line") == 0);
		}
	}
	if (elf)
		elf_end(elf);
	return found;
}

/* zlib crc32 of the whole (regular) file open on `fd`, as .gnu_debuglink
 * records it; false if the file cannot be read. */
static bool file_crc32(int fd, uint32_t *crc)
{
	struct stat st;
	const uint8_t *p;
	uLong c = crc32(0L, Z_NULL, 0);

	if (fstat(fd, &st) < 0)
		return false;
	if (st.st_size == 0) {
		*crc = (uint32_t)c;
		return true;
	}
	p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	if (p == MAP_FAILED)
		return false;
	for (size_t off = 0; off < (size_t)st.st_size;) {
		size_t chunk = (size_t)st.st_size - off;

		if (chunk > 1u << 30)
			chunk = 1u << 30;
		c = crc32(c, p + off, (uInt)chunk);
		off += chunk;
	}
	munmap((void *)p, (size_t)st.st_size);
	*crc = (uint32_t)c;
	return true;
}

/*
 * Root never follows a path another user could have planted.  A separate
 * debug file is found by name (build-id, .gnu_debuglink) in directories the
 * module's owner may not control, and what root reads from it ends up in
 * root's repository.  So when sptrace is root, a candidate is read only if
 * every name on the way to it was put there by root or by the module's
 * owner (who could put anything in the module itself anyway):
 *
 *   - every directory, symbolic link and the file itself is owned by root
 *     or by the module's owner;
 *   - no directory on the way is writable by others (or by a group other
 *     than root's) unless it is sticky, like /tmp, where others may add
 *     names but not replace those of root or the owner;
 *   - symbolic links are followed here, one component at a time, so the
 *     links and the directories they lead through are checked too.
 *
 * Paths through /proc/PID/root (a process's own file-system root, as
 * --all-loaded and attach give them) are walked from that root.
 * trust_walk() returns NULL and the file's lstat, or why the path is not
 * trusted (in `why`).
 */
typedef struct trust_walk {
	uid_t owner;         /* the module's owner, trusted beside root */
	char root[64];       /* "" or "/proc/PID/root" */
	char why[512];
	struct stat st;      /* of the last name checked */
	unsigned links;      /* symbolic links followed */
} trust_walk;

static bool trusted_entry(trust_walk *w, const char *at)
{
	if (lstat(at, &w->st) < 0) {
		snprintf(w->why, sizeof w->why, "%s: %s", at, strerror(errno));
		return false;
	}
	if (w->st.st_uid != 0 && w->st.st_uid != w->owner) {
		snprintf(w->why, sizeof w->why, "%s is owned by uid %u, neither root nor the "
			 "module's owner", at, (unsigned)w->st.st_uid);
		return false;
	}
	if (S_ISDIR(w->st.st_mode) && !(w->st.st_mode & S_ISVTX) &&
	    ((w->st.st_mode & S_IWOTH) || ((w->st.st_mode & S_IWGRP) && w->st.st_gid != 0))) {
		snprintf(w->why, sizeof w->why, "the directory %s is writable by other users",
			 at);
		return false;
	}
	return true;
}

/* Walk `path` (absolute, below w->root) one name at a time from the root. */
static bool walk_trusted(trust_walk *w, const char *path)
{
	char cur[PATH_MAX], rest[PATH_MAX];
	size_t rootlen = strlen(w->root);
	char *name, *save = NULL;

	if (snprintf(cur, sizeof cur, "%s", w->root[0] ? w->root : "/") >= (int)sizeof cur ||
	    snprintf(rest, sizeof rest, "%s", path) >= (int)sizeof rest) {
		snprintf(w->why, sizeof w->why, "%s: path too long", path);
		return false;
	}
	if (!w->root[0] && !trusted_entry(w, "/"))
		return false;
	for (name = strtok_r(rest, "/", &save); name; name = strtok_r(NULL, "/", &save)) {
		size_t len = strlen(cur);

		if (strcmp(name, ".") == 0)
			continue;
		if (strcmp(name, "..") == 0) {
			char *slash = strrchr(cur, '/');

			if (slash && (size_t)(slash - cur) >= rootlen && slash > cur)
				*slash = '\0';
			else if (!w->root[0])
				snprintf(cur, sizeof cur, "/");
			continue;
		}
		if (len + 1 + strlen(name) >= sizeof cur) {
			snprintf(w->why, sizeof w->why, "%s: path too long", path);
			return false;
		}
		snprintf(cur + len, sizeof cur - len, "%s%s", cur[len - 1] == '/' ? "" : "/",
			 name);
		if (!trusted_entry(w, cur))
			return false;
		if (S_ISLNK(w->st.st_mode)) {
			char to[PATH_MAX], next[PATH_MAX];
			const char *tail = save && *save ? save : "";
			ssize_t n = readlink(cur, to, sizeof to - 1);
			int m;

			if (n < 0 || ++w->links > 40) {
				snprintf(w->why, sizeof w->why, "%s: cannot follow the link", cur);
				return false;
			}
			to[n] = '\0';
			cur[len] = '\0';   /* the link's directory */
			if (to[0] == '/')
				m = snprintf(next, sizeof next, "%s/%s", to, tail);
			else
				m = snprintf(next, sizeof next, "%s/%s/%s", cur + rootlen, to, tail);
			if (m < 0 || (size_t)m >= sizeof next) {
				snprintf(w->why, sizeof w->why, "%s: path too long", path);
				return false;
			}
			return walk_trusted(w, next);
		}
	}
	return true;
}

/* NULL if root may read `path` for module `e` (see above), else why not,
 * in w->why; w->st is then the file's lstat. */
static const char *planted(trust_walk *w, const ca_elf *e, const char *path)
{
	struct stat mst;
	char abs[PATH_MAX];
	const char *p = path;
	int pid_len = 0;

	w->owner = e->path && stat(e->path, &mst) == 0 ? mst.st_uid : 0;
	w->root[0] = '\0';
	w->links = 0;
	if (path[0] != '/') {
		char cwd[PATH_MAX];

		if (!getcwd(cwd, sizeof cwd) ||
		    snprintf(abs, sizeof abs, "%s/%s", cwd, path) >= (int)sizeof abs) {
			snprintf(w->why, sizeof w->why, "%s: cannot make the path absolute", path);
			return w->why;
		}
		p = abs;
	}
	if (sscanf(p, "/proc/%*[0-9]/root%n", &pid_len) == 0 && pid_len > 0 &&
	    (p[pid_len] == '/' || !p[pid_len]) && (size_t)pid_len < sizeof w->root) {
		snprintf(w->root, sizeof w->root, "%.*s", pid_len, p);
		p += pid_len;
	}
	return walk_trusted(w, p) ? NULL : w->why;
}

/* `path` open if it has DWARF lines (and, for a debuglink candidate, the
 * crc32 the link records), else -1.  As root, a separate debug file must
 * not have been planted by another user (planted()): if it may have been,
 * it is not opened and the reason goes to `refused` (the first one kept). */
static int open_candidate(const ca_elf *e, const char *path, bool check_crc, char *refused,
			  size_t len)
{
	bool separate = !e->path || strcmp(path, e->path) != 0;
	trust_walk w;
	struct stat st;
	uint32_t crc;
	int fd;

	if (separate && geteuid() == 0 && planted(&w, e, path)) {
		if (access(path, F_OK) == 0 && !refused[0])
			snprintf(refused, len, "%s", w.why);
		return -1;
	}
	fd = open_regular(path);
	if (fd < 0)
		return -1;
	/* still the file that was checked, not one swapped in since */
	if (separate && geteuid() == 0 &&
	    (fstat(fd, &st) < 0 || st.st_dev != w.st.st_dev || st.st_ino != w.st.st_ino)) {
		close(fd);
		return -1;
	}
	if (!has_debug_line(fd) ||
	    (check_crc && (!file_crc32(fd, &crc) || crc != e->debuglink_crc))) {
		close(fd);
		return -1;
	}
	return fd;
}

/* The directory part of `path` ("." when it has none), in `buf`. */
static void dir_of(const char *path, char *buf, size_t len)
{
	const char *slash = strrchr(path, '/');

	if (!slash)
		snprintf(buf, len, ".");
	else if (slash == path)
		snprintf(buf, len, "/");
	else
		snprintf(buf, len, "%.*s", (int)(slash - path), path);
}

/* Try the three debuglink places for one module directory: the open file,
 * or -1. */
static int find_by_debuglink_in(const ca_elf *e, const char *dir, const char *debug_dir,
				char *out, size_t len, char *refused, size_t rlen)
{
	const char *sep = strcmp(dir, "/") == 0 ? "" : "/";
	int n, fd;

	n = snprintf(out, len, "%s%s%s", dir, sep, e->debuglink);
	if (n > 0 && (size_t)n < len && strcmp(out, e->path) != 0 &&
	    (fd = open_candidate(e, out, true, refused, rlen)) >= 0)
		return fd;
	n = snprintf(out, len, "%s%s.debug/%s", dir, sep, e->debuglink);
	if (n > 0 && (size_t)n < len && (fd = open_candidate(e, out, true, refused, rlen)) >= 0)
		return fd;
	if (dir[0] == '/') {
		n = snprintf(out, len, "%s%s%s%s", debug_dir, dir, sep, e->debuglink);
		if (n > 0 && (size_t)n < len &&
		    (fd = open_candidate(e, out, true, refused, rlen)) >= 0)
			return fd;
	}
	return -1;
}

/*
 * Which file holds the module's DWARF.  The search is done here, in this
 * order, rather than by libdwarf (whose dwarf_init_path may follow a
 * debuglink by itself), so that lines_source names the file really read:
 *
 *   1. the module itself, when it has a .debug_line;
 *   2. by build-id: <debug_dir>/.build-id/<first byte>/<rest>.debug;
 *   3. by .gnu_debuglink, the file whose zlib crc32 matches the one the
 *      link records (a mismatch is a stale file from another build):
 *        <module dir>/<link>, <module dir>/.debug/<link>,
 *        <debug_dir>/<module dir>/<link>,
 *      first for the directory as the path spells it, then for its real
 *      path when a symlink makes them differ (/lib -> /usr/lib).
 *
 * debug_dir is opt->debug_dir, else /usr/lib/debug.  Writes the path to
 * `out` and returns the file, open (the one that was checked is the one
 * read, and the sandboxed reader can open nothing), or -1 when no
 * candidate has DWARF lines; `refused` then says why a candidate that
 * exists was not read as root (see planted()), or is "".
 */
static int find_dwarf_file(const ca_elf *e, const char *debug_dir, char *out, size_t len,
			   char *refused, size_t rlen)
{
	char dir[4096], *real;
	int fd;

	refused[0] = '\0';
	if (e->path && (fd = open_candidate(e, e->path, false, refused, rlen)) >= 0) {
		snprintf(out, len, "%s", e->path);
		return fd;
	}
	if (ca_elf_debug_path(e, debug_dir, out, len) &&
	    (fd = open_candidate(e, out, false, refused, rlen)) >= 0)
		return fd;
	if (!e->debuglink || !e->debuglink[0] || !e->path)
		return -1;
	dir_of(e->path, dir, sizeof dir);
	fd = find_by_debuglink_in(e, dir, debug_dir, out, len, refused, rlen);
	if (fd >= 0)
		return fd;
	real = realpath(e->path, NULL);
	if (real) {
		char rdir[4096];

		dir_of(real, rdir, sizeof rdir);
		if (strcmp(rdir, dir) != 0)
			fd = find_by_debuglink_in(e, rdir, debug_dir, out, len, refused, rlen);
		free(real);
	}
	return fd;
}

/* ---- entry point ------------------------------------------------------ */

/* Whether address 0 is real code in this module (an ET_REL-like layout),
 * in which case sequences starting at 0 are kept. */
static bool zero_is_code(const ca_elf *e)
{
	for (size_t i = 0; i < e->nsecs; i++)
		if (e->secs[i].exec && e->secs[i].addr == 0 && e->secs[i].size > 0)
			return true;
	return false;
}

static int read_file(line_reader *lr)
{
	Dwarf_Error derr = NULL;
	int res, ret;

	/* dwarf_init_b on a descriptor follows no debuglink: we read this file. */
	res = dwarf_init_b(lr->fd, DW_DLC_READ, DW_GROUPNUMBER_ANY, NULL, NULL, &lr->dbg, &derr);
	if (res == DW_DLV_NO_ENTRY)
		return 0;
	if (res != DW_DLV_OK) {
		lr->dbg = NULL;
		return dw_fail(lr, derr, "opening");
	}
	ret = read_all_cus(lr);
	if (dwarf_finish(lr->dbg, &derr) != DW_DLV_OK && derr)
		dwarf_dealloc(NULL, derr, DW_DLA_ERROR);
	lr->dbg = NULL;
	return ret;
}

/* Read the rows of the DWARF file open on `fd` (found for `e` at `path`)
 * into m->lines. */
static int read_lines_from(ca_module *m, const ca_elf *e, int fd, const char *path, sp_err *err)
{
	line_reader lr = { .m = m, .err = err, .fd = fd, .path = path };
	int ret;

	lr.zero_is_code = zero_is_code(e);
	ret = read_file(&lr);
	if (ret == 0)
		ret = emit_rows(&lr);
	if (ret == 0)
		snprintf(m->lines_source, sizeof m->lines_source, "%s", path);
	else
		m->nlines = m->stats.nlines = 0;
	free(lr.rows);
	free(lr.runs);
	free(lr.files.off);
	free(lr.files.hash);
	free(lr.tables.key);
	free(lr.cu_file);
	free(lr.join);
	free(lr.row_file);
	if (lr.sec_elf)
		elf_end(lr.sec_elf);
	return ret;
}

/*
 * libdwarf runs in a child process.
 *
 * Debug info comes from the file being analysed, which may be hostile or
 * corrupt, and libdwarf 20210528 has memory-safety bugs on malformed input
 * (a double free in dwarf_load_rnglists, found by our fuzzer).  A crash
 * there must cost the source lines, never the analysis or the caller, and
 * the code it runs must not be able to do anything with the caller's rights.
 *
 *   1. fork(); the child starts with a copy of the module, whose string
 *      table has `base` bytes.
 *   2. The child finds the DWARF file (the module, or its separate debug
 *      file) and opens it, with the caller's rights, and sends its path
 *      (empty: no DWARF) so that even a crash is reported against it.
 *   3. It enters the sandbox (sandbox.c: only that file and the pipe left
 *      open, nobody instead of root, a seccomp filter that kills any other
 *      system call, open included) before libdwarf or libelf reads a byte
 *      of DWARF.
 *   4. It reads the lines, appending file names to its copy of the string
 *      table, and writes through the pipe: a result header, the rows, then
 *      the string-table bytes past `base`.  It leaves with _exit().
 *   5. The parent reads everything before waiting for the child (a pipe
 *      holds only 64 KiB), appends the string bytes to its own table --
 *      same base, so the offsets in the rows stay valid -- and checks the
 *      child's exit status.  Anything short or a signal is an error: SIGSYS
 *      is the sandbox stopping a forbidden system call.
 */
typedef struct lines_found {
	char source[sizeof ((ca_module *)0)->lines_source];  /* "" if none */
} lines_found;

typedef struct lines_result {
	int32_t status;         /* 0, or -1 with `error` */
	uint32_t pad;
	uint64_t nlines;
	uint64_t nstrs;         /* string bytes that follow the rows */
	char error[sizeof ((sp_err *)0)->msg];
} lines_result;

static void child_read_lines(int out, ca_module *m, const ca_elf *e, const ca_options *opt,
			     size_t base)
{
	const char *debug_dir = opt && opt->debug_dir && opt->debug_dir[0] ?
		opt->debug_dir : DEFAULT_DEBUG_DIR;
	static lines_found found;
	static lines_result r;
	sp_err err = { "" };
	char refused[sizeof err.msg];
	int fd, keep[2];

	fd = find_dwarf_file(e, debug_dir, found.source, sizeof found.source, refused,
			     sizeof refused);
	if (fd < 0)
		found.source[0] = '\0';
	if (sp_write_all(out, &found, sizeof found))
		_exit(2);
	if (fd < 0 && refused[0]) {
		r.status = -1;
		snprintf(r.error, sizeof r.error, "%s: source lines: a debug file is not read as "
			 "root because another user could have planted it: %s; make the path "
			 "root's, or analyse as the module's owner", e->path, refused);
	} else if (fd >= 0) {
		keep[0] = out;
		keep[1] = fd;
		if (ca_sandbox_enter(keep, 2, out, &err) < 0) {
			r.status = -1;
			snprintf(r.error, sizeof r.error, "%s: source lines: cannot sandbox the DWARF "
				 "reader (%s); %s is not read", e->path, err.msg, found.source);
		} else {
			r.status = read_lines_from(m, e, fd, found.source, &err);
			memcpy(r.error, err.msg, sizeof r.error);
		}
	}
	r.nlines = r.status == 0 ? m->nlines : 0;
	r.nstrs = r.status == 0 ? m->nstrs - base : 0;
	if (sp_write_all(out, &r, sizeof r) ||
	    sp_write_all(out, m->lines, r.nlines * sizeof *m->lines) ||
	    sp_write_all(out, m->strs + base, r.nstrs))
		_exit(2);
	_exit(0);
}

/* The message for a child that died or failed before its result. */
static void child_failed(const ca_elf *e, const char *source, int status, sp_err *err)
{
	const char *in = source[0] ? " in " : "", *file = source[0] ? source : "";

	if (WIFSIGNALED(status) && WTERMSIG(status) == SIGSYS)
		sp_fail(err, "%s: source lines: the DWARF reader was killed by its sandbox "
			"(a forbidden system call, SIGSYS) while reading the debug info%s%s; "
			"analysis goes on without lines (if that debug info is sound, this is "
			"a bug in sptrace: please report it)", e->path, in, file);
	else if (WIFSIGNALED(status))
		sp_fail(err, "%s: source lines: the DWARF reader crashed (signal %d) on malformed "
			"debug info%s%s; analysis goes on without lines", e->path, WTERMSIG(status),
			in, file);
	else
		sp_fail(err, "%s: source lines: the DWARF reader failed (exit status %d) on "
			"malformed debug info%s%s", e->path,
			WIFEXITED(status) ? WEXITSTATUS(status) : -1, in, file);
}

int ca_lines_read(ca_module *m, const ca_elf *e, const ca_options *opt, sp_err *err)
{
	lines_found *found;
	lines_result *r;
	size_t base = m->nstrs;
	int fds[2], status = 0, rc = -1;
	bool ok;
	pid_t pid;

	m->nlines = 0;
	m->stats.nlines = 0;
	m->lines_source[0] = '\0';
	if (opt && opt->no_lines)
		return 0;
	if (pipe2(fds, O_CLOEXEC) < 0)
		return sp_fail(err, "%s: source lines: cannot create a pipe: %s", e->path,
			       strerror(errno));
	fflush(NULL);
	pid = fork();
	if (pid < 0) {
		close(fds[0]);
		close(fds[1]);
		return sp_fail(err, "%s: source lines: cannot fork the DWARF reader: %s", e->path,
			       strerror(errno));
	}
	if (pid == 0) {
		close(fds[0]);
		child_read_lines(fds[1], m, e, opt, base);
	}
	close(fds[1]);
	found = calloc(1, sizeof *found);
	r = calloc(1, sizeof *r);
	ok = found && r && sp_read_all(fds[0], found, sizeof *found) == 0;
	if (found)
		found->source[sizeof found->source - 1] = '\0';
	ok = ok && sp_read_all(fds[0], r, sizeof *r) == 0 && r->nlines < (1u << 28) &&
	     r->nstrs < (1u << 30) && base + r->nstrs < UINT32_MAX;
	if (ok && r->nlines) {
		ok = sp_grow((void **)&m->lines, &m->caplines, r->nlines, sizeof *m->lines) == 0 &&
		     sp_read_all(fds[0], m->lines, r->nlines * sizeof *m->lines) == 0;
	}
	if (ok && r->nstrs) {
		ok = sp_grow((void **)&m->strs, &m->capstrs, base + r->nstrs, 1) == 0 &&
		     sp_read_all(fds[0], m->strs + base, r->nstrs) == 0;
	}
	close(fds[0]);
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	if (!found || !r) {
		sp_fail(err, "%s: source lines: out of memory", e->path);
	} else if (!ok || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		child_failed(e, found->source, status, err);
	} else if (r->status != 0) {
		r->error[sizeof r->error - 1] = '\0';
		sp_fail(err, "%s", r->error);
	} else {
		m->nlines = r->nlines;
		m->stats.nlines = (uint32_t)r->nlines;
		m->nstrs = base + r->nstrs;
		memcpy(m->lines_source, found->source, sizeof m->lines_source);
		rc = 0;
	}
	if (rc) {
		m->nlines = 0;
		m->nstrs = base;
	}
	free(found);
	free(r);
	return rc;
}
