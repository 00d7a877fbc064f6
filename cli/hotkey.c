/*
 * hotkey.c — `--on key CHORD`: a key chord pressed anywhere starts tracing
 * (run, attach).  The agent is loaded dormant (as with --on signal); the
 * command holds the keyboard's side and, at the chord, activates the
 * process as `sptrace activate PID` does -- nothing of it in the program.
 *
 * Backends, the first that can serve, named in the command's output:
 *   1. X11, when $DISPLAY is set: a passive grab of the chord on the root
 *      window (XGrabKey), for each combination of the lock modifiers (Caps,
 *      Num, Scroll Lock) so that they do not hide it.  The chord goes to us
 *      alone: the focused program does not see it.
 *   2. evdev, when $DISPLAY is not set and some event device under
 *      /dev/input is readable and has the chord's keys (EVIOCGBIT): the
 *      key and, for each of the chord's modifiers, its left or right key.
 *      Each such keyboard is read on its own (keychord.c tracks its
 *      modifiers; a Ctrl held on one keyboard does not make a T on another
 *      Ctrl-T).  No EVIOCGRAB: the key still goes where it went.
 *      Named with the devices: "evdev: /dev/input/event0 (AT Translated
 *      Set 2 keyboard)".  A keyboard plugged in later is read too (an
 *      inotify watch on /dev/input: an eventN created or changed -- udev
 *      may give it to the input group after devtmpfs made it -- is tried
 *      as at the start) and said on stderr; one unplugged (ENODEV) is
 *      closed, which takes it out of the epoll set, also said.  At least
 *      one keyboard must be there at the start for evdev to be chosen.
 *      This command is often root: /dev/input is opened O_NOFOLLOW and
 *      must be root's and writable by root alone, and each eventN must be
 *      a character device of the input major owned by root, checked
 *      before the open (fstatat, no link followed) and again on the
 *      opened descriptor; a link or anything else is skipped.
 *   3. the kernel module's keyboard notifier, when /dev/sptrace exists
 *      (kagent/keys.c): the chord, as Linux input key codes, is
 *      registered with SPK_IOC_KEY_CHORD and the device polls readable
 *      once it was pressed.  It sees every keyboard the kernel has (a
 *      console, a VM's PS/2 keyboard, one plugged in later), and the key
 *      still goes where it went.  The device has one opener at a time, so
 *      it cannot serve a `--kernel` command (which holds it already).
 * Why evdev before the module: evdev needs nothing loaded that the system
 * does not have already, holds nothing exclusively (two commands can wait
 * for chords, and `run|attach --kernel --on key` work, the module's one
 * opener being the --kernel side), and reads what the notifier would; the module
 * serves where no keyboard is readable through evdev (its module not
 * loaded, as in the kernel guest).
 * None available: an error that names all three and what was found.
 *
 * CHORD: modifiers and a key joined by '-' or '+': Ctrl-Alt-T, ctrl+shift+F12.
 * Modifiers: Ctrl (Control), Alt, Shift, Super (Win, Meta); the key an X
 * keysym name (T, F12, Return, space); the evdev and kernel backends know
 * the keys of a US keyboard's main block, F1-F12 and the navigation keys
 * (keycodes[]).
 */
#include "cli.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <dirent.h>
#include <sys/epoll.h>
#include <sys/inotify.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>
#include <linux/input.h>
#include <linux/major.h>
#include <X11/XKBlib.h>
#include <X11/Xlib.h>
#include <X11/keysym.h>
#include <linux/input-event-codes.h>

#include "../kagent/sptrace_kagent.h"

#include "sp.h"

/*
 * The X11 library is loaded when the X11 backend is chosen, or a chord
 * ends in a key name keycodes[] lacks (sp_dl_table), not linked: every other
 * sptrace command started 0.5-0.9 ms slower with it and its five
 * dependencies loaded (bench/START.md).  Each function below is called
 * through its slot in x11 (the macros after it), filled by x11_load.
 */
#define X11_FUNCS(X) X(XStringToKeysym) X(XKeysymToString) X(XOpenDisplay) \
	X(XKeysymToKeycode) X(XCloseDisplay) X(XSetErrorHandler) X(XGrabKey) X(XUngrabKey) \
	X(XSync) X(XkbSetDetectableAutoRepeat) X(XSelectInput) X(XFlush) X(XPending) \
	X(XNextEvent)

static struct {
#define X11_SLOT(f) __typeof__(&f) fn_##f;
	X11_FUNCS(X11_SLOT)
#undef X11_SLOT
} x11;

#define XStringToKeysym (x11.fn_XStringToKeysym)
#define XKeysymToString (x11.fn_XKeysymToString)
#define XOpenDisplay (x11.fn_XOpenDisplay)
#define XKeysymToKeycode (x11.fn_XKeysymToKeycode)
#define XCloseDisplay (x11.fn_XCloseDisplay)
#define XSetErrorHandler (x11.fn_XSetErrorHandler)
#define XGrabKey (x11.fn_XGrabKey)
#define XUngrabKey (x11.fn_XUngrabKey)
#define XSync (x11.fn_XSync)
#define XkbSetDetectableAutoRepeat (x11.fn_XkbSetDetectableAutoRepeat)
#define XSelectInput (x11.fn_XSelectInput)
#define XFlush (x11.fn_XFlush)
#define XPending (x11.fn_XPending)
#define XNextEvent (x11.fn_XNextEvent)

/* libX11.so.6 into x11: 0, or -1 with why. */
static int x11_load(char *why, size_t len)
{
#define X11_NAME(f) #f,
	static const char *const names[] = { X11_FUNCS(X11_NAME) };
#undef X11_NAME
	char dl[256];

	_Static_assert(sizeof x11 == sizeof names / sizeof *names * sizeof(void *),
		       "one slot a name");
	if (x11.fn_XNextEvent)          /* the last slot: the table is whole */
		return 0;
	if (sp_dl_table("libX11.so.6", names, sizeof names / sizeof *names, (void **)&x11, dl,
			sizeof dl) == 0)
		return 0;
	return snprintf(why, len, "the X11 library cannot be loaded (%.160s; Debian's libx11-6 has "
			"it)", dl), -1;
}

/* One keyboard the evdev backend reads. */
struct evdev_kbd {
	int fd;                  /* -1 once unplugged */
	char path[32];           /* /dev/input/eventN */
	char name[128];          /* EVIOCGNAME's */
	struct cli_keychord k;
};

struct cli_hotkey {
	int kfd;                 /* /dev/sptrace (the kernel backend), or -1 */
	int efd;                 /* evdev: an epoll set of kbd[]'s fds and ifd, or -1 */
	int ifd;                 /* evdev: inotify, watching /dev/input, or -1 */
	DIR *dir;                /* evdev: /dev/input */
	unsigned ev_code, ev_mods; /* evdev: the chord, KEY_* and SPK_MOD_* */
	struct evdev_kbd *kbd;   /* evdev: the keyboards, those unplugged with fd -1 */
	size_t nkbd;
	const char *cmd;
	char backend[512];       /* evdev's name, with its devices */
	Display *dpy;            /* the X11 backend's, or NULL */
	Window root;
	KeyCode code;
	unsigned mods;
	char chord[64];
	int error;               /* an X error arrived (the grab was refused) */
};

static int grab_refused;

static int on_x_error(Display *d, XErrorEvent *e)
{
	(void)d;
	if (e->error_code == BadAccess)
		grab_refused = 1;
	return 0;
}

static KeySym named_keysym(const char *name);

/* CHORD into modifiers and a keysym; -1 with why. */
static int parse_chord(const char *chord, unsigned *mods, KeySym *sym, char *why, size_t len)
{
	char buf[64], *save = NULL, *part, *key = NULL;

	if (strlen(chord) >= sizeof buf)
		return snprintf(why, len, "'%s' is too long for a chord", chord), -1;
	strcpy(buf, chord);
	*mods = 0;
	for (part = strtok_r(buf, "-+", &save); part; part = strtok_r(NULL, "-+", &save)) {
		if (key) {
			if (!strcasecmp(key, "ctrl") || !strcasecmp(key, "control"))
				*mods |= ControlMask;
			else if (!strcasecmp(key, "alt"))
				*mods |= Mod1Mask;
			else if (!strcasecmp(key, "shift"))
				*mods |= ShiftMask;
			else if (!strcasecmp(key, "super") || !strcasecmp(key, "win") ||
				 !strcasecmp(key, "meta"))
				*mods |= Mod4Mask;
			else
				return snprintf(why, len, "'%s' in '%s' is not a modifier (Ctrl, Alt, "
						"Shift, Super)", key, chord), -1;
		}
		key = part;
	}
	if (!key)
		return snprintf(why, len, "'%s' names no key", chord), -1;
	if (strlen(key) == 1)
		key[0] = (char)tolower((unsigned char)key[0]);   /* 'T' -> XK_t */
	/* the X11 library for the names keycodes[] lacks (the X11 backend's) */
	if ((*sym = named_keysym(key)) == NoSymbol) {
		if (x11_load(why, len) < 0)
			return -1;
		*sym = XStringToKeysym(key);
	}
	if (*sym == NoSymbol)
		return snprintf(why, len, "'%s' in '%s' is not a key name (T, F12, Return, space)",
				key, chord), -1;
	if (!*mods)
		return snprintf(why, len, "'%s' has no modifier: a chord needs Ctrl, Alt, Shift or "
				"Super, or the program would lose that key", chord), -1;
	return 0;
}

const char *cli_key_chord(const char *on, int argc, char **argv, int *optind)
{
	if (strncmp(on, "key ", 4) == 0)
		return on + 4 + strspn(on + 4, " ");
	if (strcmp(on, "key") != 0)
		return NULL;
	if (*optind < argc)
		return argv[(*optind)++];       /* --on key Ctrl-Alt-T: the chord is the next word */
	return "";
}

int cli_hotkey_check(const char *cmd, const char *chord)
{
	unsigned mods;
	KeySym sym;
	char why[256];

	if (parse_chord(chord, &mods, &sym, why, sizeof why) < 0)
		return cli_error("%s: --on key %s: %s", cmd, chord, why), 2;
	return 0;
}

/* The keysyms a chord may end in without the X11 library (evdev, the
 * kernel module: their Linux key codes), by the names XStringToKeysym
 * knows them by. */
#define K(name, code) { XK_##name, code, #name }
static const struct {
	KeySym sym;
	unsigned short code;
	const char *name;
} keycodes[] = {
	K(a, KEY_A), K(b, KEY_B), K(c, KEY_C), K(d, KEY_D), K(e, KEY_E), K(f, KEY_F), K(g, KEY_G),
	K(h, KEY_H), K(i, KEY_I), K(j, KEY_J), K(k, KEY_K), K(l, KEY_L), K(m, KEY_M), K(n, KEY_N),
	K(o, KEY_O), K(p, KEY_P), K(q, KEY_Q), K(r, KEY_R), K(s, KEY_S), K(t, KEY_T), K(u, KEY_U),
	K(v, KEY_V), K(w, KEY_W), K(x, KEY_X), K(y, KEY_Y), K(z, KEY_Z), K(0, KEY_0), K(1, KEY_1),
	K(2, KEY_2), K(3, KEY_3), K(4, KEY_4), K(5, KEY_5), K(6, KEY_6), K(7, KEY_7), K(8, KEY_8),
	K(9, KEY_9), K(F1, KEY_F1), K(F2, KEY_F2), K(F3, KEY_F3), K(F4, KEY_F4), K(F5, KEY_F5),
	K(F6, KEY_F6), K(F7, KEY_F7), K(F8, KEY_F8), K(F9, KEY_F9), K(F10, KEY_F10),
	K(F11, KEY_F11), K(F12, KEY_F12), K(Return, KEY_ENTER), K(space, KEY_SPACE),
	K(Tab, KEY_TAB), K(Escape, KEY_ESC), K(BackSpace, KEY_BACKSPACE), K(Delete, KEY_DELETE),
	K(Insert, KEY_INSERT), K(Home, KEY_HOME), K(End, KEY_END), K(Prior, KEY_PAGEUP),
	K(Next, KEY_PAGEDOWN), K(Left, KEY_LEFT), K(Right, KEY_RIGHT), K(Up, KEY_UP),
	K(Down, KEY_DOWN), K(Print, KEY_SYSRQ), K(Pause, KEY_PAUSE), K(minus, KEY_MINUS),
	K(equal, KEY_EQUAL), K(bracketleft, KEY_LEFTBRACE), K(bracketright, KEY_RIGHTBRACE),
	K(semicolon, KEY_SEMICOLON), K(apostrophe, KEY_APOSTROPHE), K(grave, KEY_GRAVE),
	K(backslash, KEY_BACKSLASH), K(comma, KEY_COMMA), K(period, KEY_DOT), K(slash, KEY_SLASH),
	K(Page_Up, KEY_PAGEUP), K(Page_Down, KEY_PAGEDOWN),
};
#undef K

/* The keysym of a key name keycodes[] has, or NoSymbol. */
static KeySym named_keysym(const char *name)
{
	for (size_t i = 0; i < sizeof keycodes / sizeof *keycodes; i++)
		if (strcmp(keycodes[i].name, name) == 0)
			return keycodes[i].sym;
	return NoSymbol;
}

/* sym's Linux key code (keycodes[]), or 0. */
static unsigned key_code(KeySym sym)
{
	for (size_t i = 0; i < sizeof keycodes / sizeof *keycodes; i++)
		if (keycodes[i].sym == sym)
			return keycodes[i].code;
	return 0;
}

/* X modifier masks as SPK_MOD_* (the evdev and kernel backends'). */
static unsigned spk_mods(unsigned mods)
{
	return (mods & ControlMask ? SPK_MOD_CTRL : 0) | (mods & Mod1Mask ? SPK_MOD_ALT : 0) |
	       (mods & ShiftMask ? SPK_MOD_SHIFT : 0) | (mods & Mod4Mask ? SPK_MOD_SUPER : 0);
}

static cli_hotkey *new_hotkey(const char *cmd, const char *chord)
{
	cli_hotkey *h = calloc(1, sizeof *h);

	if (!h) {
		cli_error("%s: out of memory", cmd);
		return NULL;
	}
	h->kfd = h->efd = h->ifd = -1;
	h->cmd = cmd;
	snprintf(h->chord, sizeof h->chord, "%s", chord);
	return h;
}

#define BIT_SET(bits, n) ((bits)[(n) / 8] >> ((n) % 8) & 1)

/* The keys held now on keyboard fd, into its chord tracker (keychord.c's
 * rule 3: at the open, and after events were dropped). */
static void resync(int fd, struct cli_keychord *k)
{
	unsigned char keys[KEY_MAX / 8 + 1] = { 0 };

	if (ioctl(fd, EVIOCGKEY(sizeof keys), keys) >= 0)
		cli_keychord_sync(k, keys, sizeof keys);
}

/* /dev/input/NAME opened if it is an input device of root's with the
 * chord's keys (the checks of the head comment): its fd, kb filled; else
 * -1, with `why` set when it could not be opened. */
static int open_keyboard(int dfd, const char *name, unsigned code, unsigned mods,
			 struct evdev_kbd *kb, char *why, size_t len)
{
	unsigned char ev[EV_MAX / 8 + 1] = { 0 }, keys[KEY_MAX / 8 + 1] = { 0 };
	struct stat st, fst;
	int fd;

	if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISCHR(st.st_mode) ||
	    st.st_uid != 0 || major(st.st_rdev) != INPUT_MAJOR)
		return -1;
	fd = openat(dfd, name, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY);
	if (fd < 0) {
		snprintf(why, len, "/dev/input/%.20s: cannot open it: %s%s", name, strerror(errno),
			 errno == EACCES ? " (the input devices are root's and the input group's)"
			 : "");
		return -1;
	}
	cli_keychord_init(&kb->k, code, mods);
	if (fstat(fd, &fst) != 0 || !S_ISCHR(fst.st_mode) || fst.st_uid != 0 ||
	    fst.st_rdev != st.st_rdev ||
	    ioctl(fd, EVIOCGBIT(0, sizeof ev), ev) < 0 || !BIT_SET(ev, EV_KEY) ||
	    ioctl(fd, EVIOCGBIT(EV_KEY, sizeof keys), keys) < 0 ||
	    !cli_keychord_fits(&kb->k, keys, sizeof keys))
		goto skip;
	snprintf(kb->path, sizeof kb->path, "/dev/input/%.20s", name);
	if (ioctl(fd, EVIOCGNAME(sizeof kb->name), kb->name) < 0)
		snprintf(kb->name, sizeof kb->name, "no name");
	kb->name[sizeof kb->name - 1] = 0;
	resync(fd, &kb->k);             /* the modifiers held already */
	return fd;
skip:
	close(fd);
	return -1;
}

/* An evdev node's name: eventN (short: the path fits evdev_kbd's). */
static int event_name(const char *name)
{
	return strncmp(name, "event", 5) == 0 && isdigit((unsigned char)name[5]) &&
	       strlen(name) <= 20;
}

/* /dev/input/NAME added to h's keyboards and to its epoll set if
 * open_keyboard takes it: its index, else -1. */
static int add_keyboard(cli_hotkey *h, const char *name, char *why, size_t len)
{
	struct evdev_kbd kb, *more;
	int fd = open_keyboard(dirfd(h->dir), name, h->ev_code, h->ev_mods, &kb, why, len);

	if (fd < 0)
		return -1;
	if (!(more = realloc(h->kbd, (h->nkbd + 1) * sizeof *more))) {
		close(fd);
		return -1;
	}
	kb.fd = fd;
	h->kbd = more;
	if (epoll_ctl(h->efd, EPOLL_CTL_ADD, fd, &(struct epoll_event){ .events = EPOLLIN })) {
		snprintf(why, len, "cannot watch %s: %s", kb.path, strerror(errno));
		close(fd);
		return -1;
	}
	h->kbd[h->nkbd] = kb;
	return (int)h->nkbd++;
}

/* evdev: every keyboard under /dev/input with the chord's keys, polled
 * through one epoll set, with an inotify watch on /dev/input for those
 * plugged in later.  NULL with `why` (for the error that names every
 * backend) when there is none; NULL and *said = 1 after an error said. */
static cli_hotkey *open_evdev(const char *cmd, const char *chord, unsigned code, unsigned mods,
			      char *why, size_t len, int *said)
{
	char open_why[256] = "";
	unsigned seen = 0;
	int watch_errno = 0;
	struct dirent *e;
	struct stat st;
	cli_hotkey *h;
	DIR *d;
	int dfd;

	dfd = open("/dev/input", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (dfd < 0)
		return snprintf(why, len, "/dev/input: %s%s", strerror(errno), errno == ENOENT ?
				" (no event devices: is the evdev module loaded?)" : ""), NULL;
	if (fstat(dfd, &st) != 0 || st.st_uid != 0 || (st.st_mode & (S_IWGRP | S_IWOTH))) {
		close(dfd);
		return snprintf(why, len, "/dev/input is not root's alone: not read"), NULL;
	}
	if (!(d = fdopendir(dfd))) {
		close(dfd);
		return snprintf(why, len, "/dev/input: %s", strerror(errno)), NULL;
	}
	if (!(h = new_hotkey(cmd, chord))) {
		closedir(d);
		return *said = 1, NULL;
	}
	h->dir = d;
	h->ev_code = code;
	h->ev_mods = mods;
	/* close-on-exec: the set, the watch and the devices are ours, not
	 * the traced program's */
	if ((h->efd = epoll_create1(EPOLL_CLOEXEC)) < 0) {
		cli_error("%s: --on key %s: cannot create an epoll set: %s", cmd, chord,
			  strerror(errno));
		cli_hotkey_close(h);
		return *said = 1, NULL;
	}
	/* The watch before the scan, so that a keyboard plugged in between
	 * is not missed (seen twice at worst: evdev_plug skips one read
	 * already).  By path: /dev/input is root's alone (checked above), and
	 * a link there is not followed. */
	if ((h->ifd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC)) < 0 ||
	    inotify_add_watch(h->ifd, "/dev/input", IN_CREATE | IN_ATTRIB | IN_MOVED_TO |
			      IN_ONLYDIR | IN_DONT_FOLLOW) < 0 ||
	    epoll_ctl(h->efd, EPOLL_CTL_ADD, h->ifd, &(struct epoll_event){ .events = EPOLLIN })) {
		watch_errno = errno;
		if (h->ifd >= 0)
			close(h->ifd);
		h->ifd = -1;
	}
	while ((e = readdir(d)))
		if (event_name(e->d_name)) {
			seen++;
			add_keyboard(h, e->d_name, open_why, sizeof open_why);
		}
	if (!h->nkbd) {
		if (!seen)
			snprintf(why, len, "/dev/input has no event device (is the evdev module "
				 "loaded?)");
		else if (*open_why)
			snprintf(why, len, "%s", open_why);
		else
			snprintf(why, len, "none of /dev/input's %u event devices has the chord's "
				 "keys", seen);
		cli_hotkey_close(h);
		return NULL;
	}
	if (h->ifd < 0)
		fprintf(stderr, "sptrace: %s: --on key %s: keyboards plugged in later will not be "
			"read (cannot watch /dev/input: %s)\n", cmd, chord, strerror(watch_errno));
	snprintf(h->backend, sizeof h->backend, "evdev: ");
	for (size_t i = 0, full = 0; i < h->nkbd; i++) {
		size_t used = strlen(h->backend);

		if (used + strlen(h->kbd[i].path) + strlen(h->kbd[i].name) + 32 < sizeof h->backend)
			snprintf(h->backend + used, sizeof h->backend - used, "%s%s (%s)",
				 i ? ", " : "", h->kbd[i].path, h->kbd[i].name);
		else if (!full++)
			snprintf(h->backend + used, sizeof h->backend - used, " and %zu more",
				 h->nkbd - i);
	}
	return h;
}

/* The kernel module's keyboard notifier: the chord registered on
 * /dev/sptrace, which then polls readable at each press. */
static cli_hotkey *open_kernel(const char *cmd, const char *chord, unsigned code, unsigned mods)
{
	struct spk_key_chord kc = { code, mods };
	cli_hotkey *h;

	if (!(h = new_hotkey(cmd, chord)))
		return NULL;
	/* close-on-exec: the device is ours, not the traced program's */
	h->kfd = open(SPK_DEVICE, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
	if (h->kfd < 0) {
		cli_error("%s: --on key %s: cannot open %s (the kernel module's keyboard notifier, "
			  "used when $DISPLAY is not set): %s%s", cmd, chord, SPK_DEVICE, strerror(errno),
			  errno == EBUSY ? " (another sptrace holds it, or this command's --kernel "
			  "does: use --on signal and 'sptrace activate PID' with --kernel)"
			  : errno == EACCES || errno == EPERM ? " (it is root's)" : "");
		free(h);
		return NULL;
	}
	if (ioctl(h->kfd, SPK_IOC_KEY_CHORD, &kc) != 0) {
		cli_error("%s: --on key %s: %s refused the chord: %s%s", cmd, chord, SPK_DEVICE,
			  strerror(errno), errno == ENOTTY ? " (the loaded module predates --on key: "
			  "load this version's sptrace_kagent.ko)" : "");
		close(h->kfd);
		free(h);
		return NULL;
	}
	return h;
}

/* X11: a passive grab of the chord on the root window of `display`. */
static cli_hotkey *open_x11(const char *cmd, const char *chord, unsigned mods, KeySym sym,
			    const char *display)
{
	static const unsigned locks[] = { 0, LockMask, Mod2Mask, Mod5Mask, LockMask | Mod2Mask,
					  LockMask | Mod5Mask, Mod2Mask | Mod5Mask,
					  LockMask | Mod2Mask | Mod5Mask };
	char why[256];
	cli_hotkey *h;

	if (x11_load(why, sizeof why) < 0) {
		cli_error("%s: --on key %s: $DISPLAY is set, but %s", cmd, chord, why);
		return NULL;
	}
	if (!(h = new_hotkey(cmd, chord)))
		return NULL;
	if (!(h->dpy = XOpenDisplay(display))) {
		cli_error("%s: --on key %s: cannot open the X display '%s' (is the X server up, and "
			  "may this user use it?)", cmd, chord, display);
		free(h);
		return NULL;
	}
	h->mods = mods;
	h->root = DefaultRootWindow(h->dpy);
	/* the connection is ours: not the traced program's */
	fcntl(ConnectionNumber(h->dpy), F_SETFD, FD_CLOEXEC);
	h->code = XKeysymToKeycode(h->dpy, sym);
	if (!h->code) {
		cli_error("%s: --on key %s: the keyboard of display '%s' has no such key", cmd, chord,
			  display);
		XCloseDisplay(h->dpy);
		free(h);
		return NULL;
	}
	grab_refused = 0;
	XSetErrorHandler(on_x_error);
	for (size_t i = 0; i < sizeof locks / sizeof *locks; i++)
		XGrabKey(h->dpy, h->code, h->mods | locks[i], h->root, True, GrabModeAsync,
			 GrabModeAsync);
	XSync(h->dpy, False);
	if (grab_refused) {
		cli_error("%s: --on key %s: another program holds that chord on display '%s'; "
			  "choose another", cmd, chord, display);
		XCloseDisplay(h->dpy);
		free(h);
		return NULL;
	}
	/* no auto-repeat press/release pairs while the chord is held */
	XkbSetDetectableAutoRepeat(h->dpy, True, NULL);
	XSelectInput(h->dpy, h->root, KeyPressMask);
	XFlush(h->dpy);
	return h;
}

cli_hotkey *cli_hotkey_open(const char *cmd, const char *chord)
{
	const char *display = getenv("DISPLAY");
	unsigned mods, code;
	KeySym sym;
	char why[256], evdev_why[320] = "";
	cli_hotkey *h;
	int said = 0;

	if (parse_chord(chord, &mods, &sym, why, sizeof why) < 0) {
		cli_error("%s: --on key %s: %s", cmd, chord, why);
		return NULL;
	}
	if (display && *display)
		return open_x11(cmd, chord, mods, sym, display);
	if (!(code = key_code(sym))) {
		cli_error("%s: --on key %s: without $DISPLAY (evdev, the kernel module's keyboard "
			  "notifier) no key '%s' is known: use a letter, a digit, F1-F12, Return, "
			  "space, Tab, Escape or a navigation key", cmd, chord, XKeysymToString(sym));
		return NULL;
	}
	if ((h = open_evdev(cmd, chord, code, spk_mods(mods), evdev_why, sizeof evdev_why, &said)) ||
	    said)
		return h;
	if (access(SPK_DEVICE, F_OK) == 0)
		return open_kernel(cmd, chord, code, spk_mods(mods));
	cli_error("%s: --on key %s: no keyboard to listen to: $DISPLAY is not set (the X11 "
		  "backend); evdev: %s; and %s does not exist (the kernel module's keyboard "
		  "notifier: load it, as root, with 'insmod DIR/sptrace_kagent.ko'); run it in the "
		  "X session, as root, or use --on signal and 'sptrace activate PID'",
		  cmd, chord, evdev_why, SPK_DEVICE);
	return NULL;
}

const char *cli_hotkey_backend(const cli_hotkey *h)
{
	return h->dpy ? "X11" : h->efd >= 0 ? h->backend : "the kernel module's keyboard notifier";
}

int cli_hotkey_fd(const cli_hotkey *h)
{
	return h->dpy ? ConnectionNumber(h->dpy) : h->efd >= 0 ? h->efd : h->kfd;
}

/* evdev: /dev/input/NAME, plugged in, read too unless it is already. */
static void evdev_plug(cli_hotkey *h, const char *name)
{
	char why[256], path[64];
	int k;

	if (!event_name(name))
		return;
	snprintf(path, sizeof path, "/dev/input/%s", name);
	for (size_t i = 0; i < h->nkbd; i++)
		if (h->kbd[i].fd >= 0 && strcmp(h->kbd[i].path, path) == 0)
			return;
	if ((k = add_keyboard(h, name, why, sizeof why)) >= 0)
		fprintf(stderr, "sptrace: %s: --on key %s: %s (%s) plugged in: read too\n",
			h->cmd, h->chord, h->kbd[k].path, h->kbd[k].name);
}

/* evdev: the keyboards plugged in since, from the watch's events (a node
 * is made root's 0600 by devtmpfs, then perhaps given to the input group:
 * created or changed, it is tried).  Events lost (the queue overflowed):
 * the whole directory is looked at again. */
static void evdev_plugged(cli_hotkey *h)
{
	char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
	ssize_t n;

	while ((n = read(h->ifd, buf, sizeof buf)) > 0)
		for (char *p = buf; p < buf + n; p += sizeof(struct inotify_event) +
		     ((struct inotify_event *)p)->len) {
			const struct inotify_event *ie = (const struct inotify_event *)p;

			if (ie->mask & IN_Q_OVERFLOW) {
				struct dirent *e;

				rewinddir(h->dir);
				while ((e = readdir(h->dir)))
					evdev_plug(h, e->d_name);
			} else if (ie->len) {
				evdev_plug(h, ie->name);
			}
		}
}

/* evdev: the chord's presses in what each keyboard has to read. */
static int evdev_pressed(cli_hotkey *h)
{
	int hits = 0;

	if (h->ifd >= 0)
		evdev_plugged(h);
	for (size_t i = 0; i < h->nkbd; i++) {
		struct evdev_kbd *kb = &h->kbd[i];
		struct input_event ev[64];
		ssize_t n;

		if (kb->fd < 0)
			continue;
		/* nonblocking: EAGAIN once read; evdev returns whole events */
		while ((n = read(kb->fd, ev, sizeof ev)) >= (ssize_t)sizeof *ev)
			for (size_t j = 0; j < (size_t)n / sizeof *ev; j++) {
				int r = cli_keychord_event(&kb->k, ev[j].type, ev[j].code,
							   ev[j].value);

				if (r > 0 && hits < INT_MAX)
					hits++;
				else if (r < 0)
					resync(kb->fd, &kb->k);
			}
		if (n < 0 && errno != EAGAIN && errno != EINTR) {
			/* ENODEV: unplugged.  Closing takes it out of the epoll set,
			 * which would otherwise poll readable (EPOLLHUP) for ever. */
			fprintf(stderr, "sptrace: %s: --on key %s: %s (%s) is gone (%s): the chord "
				"is no longer read from it\n", h->cmd, h->chord, kb->path, kb->name,
				strerror(errno));
			close(kb->fd);
			kb->fd = -1;
		}
	}
	return hits;
}

int cli_hotkey_pressed(cli_hotkey *h)
{
	int hits = 0;

	if (h->efd >= 0)
		return evdev_pressed(h);
	if (!h->dpy) {
		uint64_t n = 0;

		/* nonblocking: 0 presses is EAGAIN */
		if (read(h->kfd, &n, sizeof n) != (ssize_t)sizeof n)
			return 0;
		return n > INT_MAX ? INT_MAX : (int)n;
	}
	while (XPending(h->dpy)) {
		XEvent ev;

		XNextEvent(h->dpy, &ev);
		if (ev.type == KeyPress && ev.xkey.keycode == h->code &&
		    (ev.xkey.state & (ControlMask | Mod1Mask | ShiftMask | Mod4Mask)) == h->mods)
			hits++;
	}
	return hits;
}

int cli_hotkey_wait(cli_hotkey *h, int timeout_ms)
{
	struct pollfd p = { cli_hotkey_fd(h), POLLIN, 0 };

	if ((h->dpy && XPending(h->dpy)) || poll(&p, 1, timeout_ms) > 0)
		return cli_hotkey_pressed(h);
	return 0;
}

void cli_hotkey_close(cli_hotkey *h)
{
	if (!h)
		return;
	if (h->dpy) {
		XUngrabKey(h->dpy, h->code, AnyModifier, h->root);
		XCloseDisplay(h->dpy);
	}
	if (h->kfd >= 0)
		close(h->kfd);   /* the module unregisters the notifier */
	for (size_t i = 0; i < h->nkbd; i++)
		if (h->kbd[i].fd >= 0)
			close(h->kbd[i].fd);
	if (h->ifd >= 0)
		close(h->ifd);
	if (h->efd >= 0)
		close(h->efd);
	if (h->dir)
		closedir(h->dir);
	free(h->kbd);
	free(h);
}
