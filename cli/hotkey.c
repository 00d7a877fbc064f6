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
 *   (the kernel module's keyboard notifier and evdev devices are issue 15's
 *   next backends; neither is built yet)
 * None available: an error that names what was looked for.
 *
 * CHORD: modifiers and a key joined by '-' or '+': Ctrl-Alt-T, ctrl+shift+F12.
 * Modifiers: Ctrl (Control), Alt, Shift, Super (Win, Meta); the key an X
 * keysym name (T, F12, Return, space).
 */
#include "cli.h"

#include <ctype.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <X11/XKBlib.h>
#include <X11/Xlib.h>
#include <X11/keysym.h>

struct cli_hotkey {
	Display *dpy;
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

cli_hotkey *cli_hotkey_open(const char *cmd, const char *chord)
{
	static const unsigned locks[] = { 0, LockMask, Mod2Mask, Mod5Mask, LockMask | Mod2Mask,
					  LockMask | Mod5Mask, Mod2Mask | Mod5Mask,
					  LockMask | Mod2Mask | Mod5Mask };
	const char *display = getenv("DISPLAY");
	cli_hotkey *h;
	KeySym sym;
	char why[256];

	if (parse_chord(chord, &(unsigned){ 0 }, &sym, why, sizeof why) < 0) {
		cli_error("%s: --on key %s: %s", cmd, chord, why);
		return NULL;
	}
	if (!display || !*display) {
		cli_error("%s: --on key %s: no keyboard to listen to: $DISPLAY is not set (the X11 "
			  "backend), and this version has no other (the kernel module's keyboard "
			  "notifier and evdev devices are not built yet); run it in the X session, "
			  "or use --on signal and 'sptrace activate PID'", cmd, chord);
		return NULL;
	}
	if (!(h = calloc(1, sizeof *h))) {
		cli_error("%s: out of memory", cmd);
		return NULL;
	}
	snprintf(h->chord, sizeof h->chord, "%s", chord);
	if (!(h->dpy = XOpenDisplay(display))) {
		cli_error("%s: --on key %s: cannot open the X display '%s' (is the X server up, and "
			  "may this user use it?)", cmd, chord, display);
		free(h);
		return NULL;
	}
	parse_chord(chord, &h->mods, &sym, why, sizeof why);
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

const char *cli_hotkey_backend(const cli_hotkey *h)
{
	(void)h;
	return "X11";
}

int cli_hotkey_fd(const cli_hotkey *h)
{
	return ConnectionNumber(h->dpy);
}

int cli_hotkey_pressed(cli_hotkey *h)
{
	int hits = 0;

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

	if (XPending(h->dpy) || poll(&p, 1, timeout_ms) > 0)
		return cli_hotkey_pressed(h);
	return 0;
}

void cli_hotkey_close(cli_hotkey *h)
{
	if (!h)
		return;
	XUngrabKey(h->dpy, h->code, AnyModifier, h->root);
	XCloseDisplay(h->dpy);
	free(h);
}
