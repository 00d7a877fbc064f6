/*
 * demangle.c — C++ names as uftrace shows them (an_demangle). See analysis.h
 * for what each promises.
 */
#include "an_internal.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* C++ names                                                                 */
/* ------------------------------------------------------------------------ */

/* The C++ runtime's demangler (libstdc++, <cxxabi.h>): a malloc'ed string,
 * or NULL with *status < 0.  Loaded at the first C++ name, not linked: every
 * sptrace command started 0.5-0.9 ms slower with libstdc++ loaded
 * (bench/START.md), and most traces of C programs have no C++ name.
 * Without it, C++ names are shown as they are. */
typedef char *(*cxa_demangle_fn)(const char *mangled, char *buf, size_t *len, int *status);

static cxa_demangle_fn cxa_demangle;
static pthread_once_t cxa_once = PTHREAD_ONCE_INIT;

static void cxa_load(void)
{
	static const char *const name[] = { "__cxa_demangle" };
	void *slot = NULL;
	char why[256];

	if (sp_dl_table("libstdc++.so.6", name, 1, &slot, why, sizeof why) == 0)
		cxa_demangle = (cxa_demangle_fn)slot;
}

/* Longer symbols are shown as they are: the demangler keeps its work space
 * on the stack, tens of bytes per character of the symbol.  (It also gives
 * up, and the symbol is shown as it is, on names nested some 500 deep.) */
#define DEMANGLE_MAX_SYMBOL 16384

static int starts(const char *s, const char *prefix)
{
	return strncmp(s, prefix, strlen(prefix)) == 0;
}

static int is_ident(char c)
{
	return isalnum((unsigned char)c) || c == '_' || c == '$';
}

/* p at `open`: past its matching `close`, NULL if there is none. */
static const char *skip_group(const char *p, char open, char close)
{
	int depth = 0;

	for (; *p; p++) {
		if (*p == open)
			depth++;
		else if (*p == close && --depth == 0)
			return p + 1;
	}
	return NULL;
}

/* p at the '<' of template arguments: past the matching '>'.  An argument
 * may be an expression; the demangler puts one holding '<' or '>' in
 * parentheses ("Box<((1)>(2))>"), so angle brackets count outside them only. */
static const char *skip_template_args(const char *p)
{
	int angles = 0, parens = 0;

	for (; *p; p++) {
		if (*p == '(')
			parens++;
		else if (*p == ')')
			parens--;
		else if (parens == 0 && *p == '<')
			angles++;
		else if (parens == 0 && *p == '>' && --angles == 0)
			return p + 1;
	}
	return NULL;
}

/* p just after a parameter list: past the qualifiers that may follow it
 * (" const", " &&", " noexcept" ...).  NULL if malformed. */
static const char *skip_qualifiers(const char *p)
{
	static const char *const quals[] = {
		" const", " volatile", " restrict", " &&", " &", " noexcept", " throw",
		" transaction_safe",
	};

	for (;;) {
		size_t i, n = 0;

		for (i = 0; i < sizeof quals / sizeof *quals; i++) {
			n = strlen(quals[i]);
			if (strncmp(p, quals[i], n) == 0 && (quals[i][n - 1] == '&' || !is_ident(p[n])))
				break;
		}
		if (i == sizeof quals / sizeof *quals)
			return p;
		p += n;
		if (*p == '(' && (quals[i][1] == 'n' || quals[i][1] == 't') &&
		    !(p = skip_group(p, '(', ')')))
			return NULL;
	}
}

/*
 * What follows the ')' of a parameter list at p, after its qualifiers: the
 * end of the name (these were the function's parameters), "::" (they were
 * those of a function enclosing a local name: "outer(int)::Local::f()"),
 * or ')' (the function's, inside a declarator: "int (*f(char))(int)").
 */
enum after_params { AFTER_OTHER, AFTER_END, AFTER_SCOPE, AFTER_DECLARATOR };

static enum after_params after_params(const char *p)
{
	p = skip_qualifiers(p);
	if (!p)
		return AFTER_OTHER;
	if (!*p || starts(p, " [clone "))
		return AFTER_END;
	if (starts(p, "::"))
		return AFTER_SCOPE;
	return *p == ')' ? AFTER_DECLARATOR : AFTER_OTHER;
}

/*
 * After "operator" at p: its token, appended to out[*n], and p past it.
 * The token is punctuation ("<<", "()", "->*"), a word (" new[]"), a
 * literal suffix ("\"\" _km") or, for a conversion operator, a type (" int",
 * " char const*") that runs up to the empty parameter list ending the name.
 * NULL when the name does not parse.
 */
static const char *copy_operator(const char *p, char *out, size_t *n)
{
	static const char *const ops[] = {   /* longest first */
		"->*", "<=>", "<<=", ">>=", "()", "[]", "->", "++", "--", "<<", ">>", "<=",
		">=", "==", "!=", "&&", "||", "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=",
		"+", "-", "*", "/", "%", "^", "&", "|", "~", "!", "=", "<", ">", ",",
		" new[]", " delete[]", " new", " delete", " co_await",
	};
	const char *q;

	for (size_t i = 0; i < sizeof ops / sizeof *ops; i++) {
		size_t len = strlen(ops[i]);

		if (strncmp(p, ops[i], len) != 0 || (is_ident(ops[i][len - 1]) && is_ident(p[len])))
			continue;
		memcpy(out + *n, p, len);
		*n += len;
		p += len;
		/* "operator<< <char>(...)": the space keeps "<<<" apart. */
		return starts(p, " <") ? p + 1 : p;
	}
	if (*p == '"') {
		q = strchr(p, '(');
	} else if (*p == ' ') {
		for (q = p; q && *q; ) {
			if (*q == '<') {
				q = skip_template_args(q);
			} else if (*q == '(') {
				const char *r = skip_group(q, '(', ')');

				if (r == q + 2 && after_params(r) != AFTER_OTHER)
					break;
				q = r;
			} else {
				q++;
			}
		}
	} else {
		return NULL;
	}
	if (!q)
		return NULL;
	memcpy(out + *n, p, (size_t)(q - p));
	*n += (size_t)(q - p);
	return q;
}

/*
 * uftrace's "simple" form of a demangled function name: the qualified name
 * alone.  Template arguments, ABI tags and parameter lists are dropped,
 * also those of an enclosing function ("outer(int)::Local::f(int)" is
 * "outer::Local::f"), and so is whatever precedes the name after a space
 * (the return type of a template function, "non-virtual thunk to").
 * Lambdas and unnamed types keep their "{lambda(int)#1}".  A name this does
 * not parse is returned whole.  NULL when out of memory.
 */
static char *simple_name(const char *d)
{
	char *out = malloc(strlen(d) + 1);
	const char *p = d;
	size_t n = 0;
	int declarator = 0;

	if (!out)
		return NULL;
	while (p && *p) {
		const char *q;

		if (starts(p, "(anonymous namespace)")) {
			memcpy(out + n, p, 21);
			n += 21;
			p += 21;
		} else if (starts(p, "operator") && !is_ident(p[8]) && (p == d || !is_ident(p[-1]))) {
			memcpy(out + n, p, 8);
			n += 8;
			p = copy_operator(p + 8, out, &n);
		} else if (*p == '{') {
			if ((q = skip_group(p, '{', '}'))) {
				memcpy(out + n, p, (size_t)(q - p));
				n += (size_t)(q - p);
			}
			p = q;
		} else if (*p == '[') {
			p = skip_group(p, '[', ']');
		} else if (*p == '<') {
			p = skip_template_args(p);
		} else if (n == 0 && starts(p, "decltype (")) {
			p = skip_group(p + 9, '(', ')');   /* a return type */
		} else if (*p == '(' && n == 0) {
			/* A declarator around the name: "int (*f(char))(int)". */
			for (p++; *p == '*' || *p == '&'; p++)
				;
			declarator = 1;
		} else if (*p == '(') {
			enum after_params a = (q = skip_group(p, '(', ')')) ? after_params(q)
					      : AFTER_OTHER;

			if (a == AFTER_END || (a == AFTER_DECLARATOR && declarator))
				break;
			p = a == AFTER_SCOPE ? skip_qualifiers(q) : NULL;
		} else if (*p == ' ') {
			n = 0;   /* what came before was a return type */
			p++;
		} else {
			out[n++] = *p++;
		}
	}
	if (!p || n == 0) {
		free(out);
		return strdup(d);
	}
	out[n] = '\0';
	return out;
}

int an_demangle_style(const char *name)
{
	if (strcmp(name, "simple") == 0)
		return AN_DEMANGLE_SIMPLE;
	if (strcmp(name, "full") == 0)
		return AN_DEMANGLE_FULL;
	if (strcmp(name, "no") == 0)
		return AN_DEMANGLE_NO;
	return -1;
}

/* __cxa_demangle of the first len characters of sym; NULL if they are not
 * a mangled name (or out of memory). */
static char *demangle_prefix(const char *sym, size_t len)
{
	char *head = strndup(sym, len), *d;
	int status = 0;

	pthread_once(&cxa_once, cxa_load);
	if (!head || !cxa_demangle) {
		free(head);
		return NULL;
	}
	d = cxa_demangle(head, NULL, NULL, &status);
	free(head);
	return status == 0 ? d : NULL;
}

/*
 * The runtime demangles a symbol, not a PLT entry's "sym@plt" or a versioned
 * "sym@@VER": the part before '@' is demangled and the rest kept.  It also
 * knows clone suffixes (".cold" becomes " [clone .cold]"), which the full
 * form keeps that way; the simple form demangles the part before the first
 * '.' and keeps ".cold" as it is.
 */
char *an_demangle(const char *sym, int style)
{
	size_t at = strcspn(sym, "@"), dot = strcspn(sym, ".@");
	const char *suffix;
	char *d = NULL, *name, *out;

	if (style == AN_DEMANGLE_NO || !starts(sym, "_Z") || at > DEMANGLE_MAX_SYMBOL)
		return strdup(sym);
	if (style == AN_DEMANGLE_FULL && dot < at && (d = demangle_prefix(sym, at)))
		suffix = sym + at;
	else if ((d = demangle_prefix(sym, dot)))
		suffix = sym + dot;
	else
		return strdup(sym);
	name = style == AN_DEMANGLE_SIMPLE ? simple_name(d) : d;
	if (name != d)
		free(d);
	if (!name || !*suffix)
		return name;
	if (asprintf(&out, "%s%s", name, suffix) < 0)
		out = NULL;
	free(name);
	return out;
}

/* The name of function fi of module m as the trace shows it, demangled once
 * per function; NULL when out of memory. */
const char *an_symbol_name(an_trace *t, const module *m, uint32_t fi)
{
	size_t nf;
	const char *sym = ca_str(m->ca, ca_module_funcs(m->ca, &nf)[fi].name);
	map_slot *slot;
	char *name;

	if (t->demangle == AN_DEMANGLE_NO || !starts(sym, "_Z"))
		return sym;
	if (!(slot = an_map_get(&t->demangled_ids, m->pub.index, fi)))
		return NULL;
	if (slot->val)
		return t->demangled[slot->val - 1];
	if (sp_grow((void **)&t->demangled, &t->capdemangled, t->ndemangled + 1,
		    sizeof *t->demangled) ||
	    !(name = an_demangle(sym, t->demangle)))
		return NULL;
	t->demangled[t->ndemangled++] = name;
	slot->val = (uint32_t)t->ndemangled;
	return name;
}

