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
 *   2. the kernel module's keyboard notifier, when $DISPLAY is not set and
 *      /dev/sptrace exists (kagent/keys.c): the chord, as Linux input key
 *      codes, is registered with SPK_IOC_KEY_CHORD and the device polls
 *      readable once it was pressed.  It sees every keyboard the kernel
 *      has (a console, a VM's PS/2 keyboard), and the key still goes
 *      where it went.  The device has one opener at a time, so it cannot
 *      serve a `--kernel` command (which holds it already).
 *   (evdev devices are issue 15's next backend; not built yet)
 * None available: an error that names what was looked for.
 *
 * CHORD: modifiers and a key joined by '-' or '+': Ctrl-Alt-T, ctrl+shift+F12.
 * Modifiers: Ctrl (Control), Alt, Shift, Super (Win, Meta); the key an X
 * keysym name (T, F12, Return, space); the kernel backend knows the keys
 * of a US keyboard's main block, F1-F12 and the navigation keys (keycodes[]).
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
#include <sys/ioctl.h>
#include <unistd.h>
#include <X11/XKBlib.h>
#include <X11/Xlib.h>
#include <X11/keysym.h>
#include <linux/input-event-codes.h>

#include "../kagent/sptrace_kagent.h"

struct cli_hotkey {
	int kfd;                 /* /dev/sptrace (the kernel backend), or -1 */
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
	*sym = XStringToKeysym(key);
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

/* The kernel backend's key codes of the keysyms a chord may end in. */
static const struct {
	KeySym sym;
	unsigned short code;
} keycodes[] = {
	{ XK_a, KEY_A }, { XK_b, KEY_B }, { XK_c, KEY_C }, { XK_d, KEY_D }, { XK_e, KEY_E },
	{ XK_f, KEY_F }, { XK_g, KEY_G }, { XK_h, KEY_H }, { XK_i, KEY_I }, { XK_j, KEY_J },
	{ XK_k, KEY_K }, { XK_l, KEY_L }, { XK_m, KEY_M }, { XK_n, KEY_N }, { XK_o, KEY_O },
	{ XK_p, KEY_P }, { XK_q, KEY_Q }, { XK_r, KEY_R }, { XK_s, KEY_S }, { XK_t, KEY_T },
	{ XK_u, KEY_U }, { XK_v, KEY_V }, { XK_w, KEY_W }, { XK_x, KEY_X }, { XK_y, KEY_Y },
	{ XK_z, KEY_Z },
	{ XK_0, KEY_0 }, { XK_1, KEY_1 }, { XK_2, KEY_2 }, { XK_3, KEY_3 }, { XK_4, KEY_4 },
	{ XK_5, KEY_5 }, { XK_6, KEY_6 }, { XK_7, KEY_7 }, { XK_8, KEY_8 }, { XK_9, KEY_9 },
	{ XK_F1, KEY_F1 }, { XK_F2, KEY_F2 }, { XK_F3, KEY_F3 }, { XK_F4, KEY_F4 },
	{ XK_F5, KEY_F5 }, { XK_F6, KEY_F6 }, { XK_F7, KEY_F7 }, { XK_F8, KEY_F8 },
	{ XK_F9, KEY_F9 }, { XK_F10, KEY_F10 }, { XK_F11, KEY_F11 }, { XK_F12, KEY_F12 },
	{ XK_Return, KEY_ENTER }, { XK_space, KEY_SPACE }, { XK_Tab, KEY_TAB },
	{ XK_Escape, KEY_ESC }, { XK_BackSpace, KEY_BACKSPACE }, { XK_Delete, KEY_DELETE },
	{ XK_Insert, KEY_INSERT }, { XK_Home, KEY_HOME }, { XK_End, KEY_END },
	{ XK_Prior, KEY_PAGEUP }, { XK_Next, KEY_PAGEDOWN }, { XK_Left, KEY_LEFT },
	{ XK_Right, KEY_RIGHT }, { XK_Up, KEY_UP }, { XK_Down, KEY_DOWN },
	{ XK_Print, KEY_SYSRQ }, { XK_Pause, KEY_PAUSE },
	{ XK_minus, KEY_MINUS }, { XK_equal, KEY_EQUAL }, { XK_bracketleft, KEY_LEFTBRACE },
	{ XK_bracketright, KEY_RIGHTBRACE }, { XK_semicolon, KEY_SEMICOLON },
	{ XK_apostrophe, KEY_APOSTROPHE }, { XK_grave, KEY_GRAVE },
	{ XK_backslash, KEY_BACKSLASH }, { XK_comma, KEY_COMMA }, { XK_period, KEY_DOT },
	{ XK_slash, KEY_SLASH },
};

/* The kernel module's keyboard notifier: the chord registered on
 * /dev/sptrace, which then polls readable at each press. */
static cli_hotkey *open_kernel(const char *cmd, const char *chord, unsigned mods, KeySym sym)
{
	struct spk_key_chord kc = { 0, 0 };
	cli_hotkey *h;

	for (size_t i = 0; i < sizeof keycodes / sizeof *keycodes; i++)
		if (keycodes[i].sym == sym)
			kc.code = keycodes[i].code;
	if (!kc.code) {
		cli_error("%s: --on key %s: the kernel module's keyboard notifier (the backend without "
			  "$DISPLAY) knows no key '%s': use a letter, a digit, F1-F12, Return, space, "
			  "Tab, Escape or a navigation key", cmd, chord, XKeysymToString(sym));
		return NULL;
	}
	kc.mods = (mods & ControlMask ? SPK_MOD_CTRL : 0) | (mods & Mod1Mask ? SPK_MOD_ALT : 0) |
		  (mods & ShiftMask ? SPK_MOD_SHIFT : 0) | (mods & Mod4Mask ? SPK_MOD_SUPER : 0);
	if (!(h = calloc(1, sizeof *h))) {
		cli_error("%s: out of memory", cmd);
		return NULL;
	}
	snprintf(h->chord, sizeof h->chord, "%s", chord);
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
	cli_hotkey *h;

	if (!(h = calloc(1, sizeof *h))) {
		cli_error("%s: out of memory", cmd);
		return NULL;
	}
	h->kfd = -1;
	snprintf(h->chord, sizeof h->chord, "%s", chord);
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
	unsigned mods;
	KeySym sym;
	char why[256];

	if (parse_chord(chord, &mods, &sym, why, sizeof why) < 0) {
		cli_error("%s: --on key %s: %s", cmd, chord, why);
		return NULL;
	}
	if (display && *display)
		return open_x11(cmd, chord, mods, sym, display);
	if (access(SPK_DEVICE, F_OK) == 0)
		return open_kernel(cmd, chord, mods, sym);
	cli_error("%s: --on key %s: no keyboard to listen to: $DISPLAY is not set (the X11 "
		  "backend), and %s does not exist (the kernel module's keyboard notifier: load "
		  "it, as root, with 'insmod DIR/sptrace_kagent.ko'); evdev devices are not read "
		  "yet; run it in the X session, or use --on signal and 'sptrace activate PID'",
		  cmd, chord, SPK_DEVICE);
	return NULL;
}

const char *cli_hotkey_backend(const cli_hotkey *h)
{
	return h->dpy ? "X11" : "the kernel module's keyboard notifier";
}

int cli_hotkey_fd(const cli_hotkey *h)
{
	return h->dpy ? ConnectionNumber(h->dpy) : h->kfd;
}

int cli_hotkey_pressed(cli_hotkey *h)
{
	int hits = 0;

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
	} else {
		close(h->kfd);   /* the module unregisters the notifier */
	}
	free(h);
}
