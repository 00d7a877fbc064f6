/*
 * msgs.c — the channels file; texts of channels and messages. See analysis.h
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
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

int an_read_channels(an_trace *t, sp_err *err)
{
	char path[PATH_MAX], *buf;
	size_t len;
	uint32_t rec = 0;

	snprintf(path, sizeof path, "%s/channels", t->dir);
	if (an_slurp(path, (size_t)(1u << 22) * sizeof(trace_channel), &buf, &len) < 0) {
		if (errno == ENOENT)
			return 0;
		return sp_fail(err, "%s: cannot read: %s", path, an_errno_text(errno));
	}
	if (len >= 8)
		memcpy(&rec, buf + 4, 4);       /* record 0's pid: the record size */
	if (rec == 0)
		rec = TRACE_CHANNEL_V1_SIZE;
	if (rec < TRACE_CHANNEL_V1_SIZE || rec > 4096 || rec % 8) {
		free(buf);
		return sp_fail(err, "%s: a record size of %u bytes in record 0; not a channels file "
			       "of this sptrace (records of %zu bytes)", path, rec,
			       sizeof(trace_channel));
	}
	if (len % rec)
		an_warn(t, "%s: %zu bytes after the last whole channel record ignored (a record the "
		     "agent was writing)", path, len % rec);
	t->nchans = len / rec;
	if (rec != sizeof(trace_channel)) {
		/* another layout: each record copied, later fields zero, unknown ones cut */
		trace_channel *c = calloc(t->nchans ? t->nchans : 1, sizeof *c);

		if (!c) {
			free(buf);
			return sp_fail(err, "out of memory");
		}
		for (size_t i = 0; i < t->nchans; i++)
			memcpy(&c[i], buf + i * rec, rec < sizeof *c ? rec : sizeof *c);
		free(buf);
		buf = (char *)c;
	}
	t->chans = (trace_channel *)buf;
	return 0;
}

const trace_channel *an_channel(const an_trace *t, uint32_t id)
{
	if (id == 0 || id >= t->nchans || t->chans[id].proto == 0 ||
	    t->chans[id].proto > TRACE_PROTO_MAX)
		return NULL;
	return &t->chans[id];
}

size_t an_nchannels(const an_trace *t)
{
	return t->nchans;
}

const an_msg *an_trace_msg(const an_trace *t, uint32_t i)
{
	return i < t->nmsgs ? &t->msgs[i] : NULL;
}

int an_trace_value(const an_trace *t, uint32_t i, int64_t *value)
{
	if (i >= t->nvalues)
		return -1;
	*value = t->values[i];
	return 0;
}

const an_budget *an_trace_budget(const an_trace *t, uint32_t i)
{
	return i < t->nbudget ? &t->budget[i] : NULL;
}

static const char *proto_name(uint32_t p)
{
	switch (p) {
	case TRACE_PROTO_TCP: return "tcp";
	case TRACE_PROTO_UDP: return "udp";
	case TRACE_PROTO_UNIX_STREAM: return "unix";
	case TRACE_PROTO_UNIX_DGRAM: return "unix-dgram";
	case TRACE_PROTO_UNIX_SEQPACKET: return "unix-seqpacket";
	case TRACE_PROTO_PIPE: return "pipe";
	default: return "?";
	}
}

static void addr_text(const trace_channel *c, int local, char *buf, size_t len)
{
	const uint8_t *a = local ? c->local_addr : c->peer_addr;
	unsigned port = local ? c->local_port : c->peer_port;
	const char *path = local ? c->local_path : c->peer_path;
	char ip[INET6_ADDRSTRLEN];

	if (!local && !(c->flags & TRACE_CHAN_PEER)) {
		snprintf(buf, len, "?");
	} else if (c->family == AF_INET) {
		inet_ntop(AF_INET, a, ip, sizeof ip);
		snprintf(buf, len, "%s:%u", ip, port);
	} else if (c->family == AF_INET6) {
		inet_ntop(AF_INET6, a, ip, sizeof ip);
		snprintf(buf, len, "[%s]:%u", ip, port);
	} else {
		snprintf(buf, len, "%.31s", path[0] ? path : "(unnamed)");
	}
}

char *an_channel_text(const an_trace *t, uint32_t id, int recv, char *buf, size_t len)
{
	const trace_channel *c = an_channel(t, id);
	char l[80], p[80];

	if (!c) {
		snprintf(buf, len, "channel %u", id);
		return buf;
	}
	if (c->proto == TRACE_PROTO_PIPE) {
		snprintf(buf, len, "pipe %" PRIu64, c->inode);
		return buf;
	}
	addr_text(c, 1, l, sizeof l);
	addr_text(c, 0, p, sizeof p);
	if (c->family == AF_UNIX && (c->flags & TRACE_CHAN_PEER_INODE) && !c->local_path[0] &&
	    !c->peer_path[0])
		snprintf(buf, len, "%s %" PRIu64 " %s %" PRIu64, proto_name(c->proto), c->inode,
			 recv ? "<-" : "->", c->peer_inode);
	else if (c->family == AF_UNIX && (c->flags & TRACE_CHAN_PEER_INODE))
		snprintf(buf, len, "%s %" PRIu64 " %s %s %s %" PRIu64, proto_name(c->proto),
			 c->inode, l, recv ? "<-" : "->", p, c->peer_inode);
	else if (c->family == AF_UNIX && !c->local_path[0] && !c->peer_path[0])
		snprintf(buf, len, "%s %" PRIu64, proto_name(c->proto), c->inode);
	else if (c->family == AF_UNIX)
		snprintf(buf, len, "%s %" PRIu64 " %s %s %s", proto_name(c->proto), c->inode, l,
			 recv ? "<-" : "->", p);
	else
		snprintf(buf, len, "%s %s %s %s", proto_name(c->proto), l, recv ? "<-" : "->", p);
	return buf;
}

static const char *const call_names[] = {
	[TRACE_CALL_SEND] = "send", [TRACE_CALL_SENDTO] = "sendto",
	[TRACE_CALL_SENDMSG] = "sendmsg", [TRACE_CALL_SENDMMSG] = "sendmmsg",
	[TRACE_CALL_WRITE] = "write", [TRACE_CALL_WRITEV] = "writev",
	[TRACE_CALL_RECV] = "recv", [TRACE_CALL_RECVFROM] = "recvfrom",
	[TRACE_CALL_RECVMSG] = "recvmsg", [TRACE_CALL_RECVMMSG] = "recvmmsg",
	[TRACE_CALL_READ] = "read", [TRACE_CALL_READV] = "readv",
	[TRACE_CALL_SPLICE] = "splice", [TRACE_CALL_SENDFILE] = "sendfile",
	[TRACE_CALL_SHUTDOWN] = "shutdown", [TRACE_CALL_EOF] = "eof",
};

char *an_msg_text(const an_trace *t, const an_msg *m, char *buf, size_t len)
{
	char ch[300];
	const char *call = m->call <= TRACE_CALL_MAX && call_names[m->call] ? call_names[m->call]
			   : m->recv ? "recv?" : "send?";

	an_channel_text(t, m->chan, m->recv, ch, sizeof ch);
	if (m->flags & TRACE_MSG_DGRAM)
		snprintf(buf, len, "%s(%s, datagram %" PRIu64 ", %" PRIu64 " bytes)", call, ch,
			 m->off, m->len);
	else if (m->len == 0)
		snprintf(buf, len, "%s(%s, at byte %" PRIu64 ")", call, ch, m->off);
	else
		snprintf(buf, len, "%s(%s, bytes %" PRIu64 "..%" PRIu64 ")", call, ch, m->off,
			 m->off + m->len);
	return buf;
}

/* Name every site of the file (after the modules are loaded).  A record of
 * zeros is a hole the agent never wrote: such ids stay invalid. */