/*
 * common/unixdiag.c — a UNIX socket's peer, asked of the kernel's sock_diag
 * (sp.h): the request and the reading of its answer, shared by the agent
 * (agent/msgs.c: unix_peer, on its own netlink socket) and spdaemon
 * (spdaemon/holders.c: spd_unix_peer, for a forked writer that knows only
 * its own socket).  Each sends and receives on its own descriptor.
 */
#include <string.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/sock_diag.h>
#include <linux/unix_diag.h>
#include <sys/socket.h>

#include "sp.h"

typedef struct unix_peer_req {
	struct nlmsghdr nh;
	struct unix_diag_req req;
} unix_peer_req;

_Static_assert(sizeof(unix_peer_req) <= SP_UNIX_PEER_REQ_BYTES, "SP_UNIX_PEER_REQ_BYTES");

size_t sp_unix_peer_request(void *buf, uint64_t inode)
{
	unix_peer_req q = {
		.nh = { .nlmsg_len = sizeof q, .nlmsg_type = SOCK_DIAG_BY_FAMILY,
			.nlmsg_flags = NLM_F_REQUEST, .nlmsg_seq = 1 },
		.req = { .sdiag_family = AF_UNIX, .udiag_states = ~0u,
			 .udiag_ino = (uint32_t)inode, .udiag_show = UDIAG_SHOW_PEER,
			 .udiag_cookie = { ~0u, ~0u } } };

	memcpy(buf, &q, sizeof q);
	return sizeof q;
}

uint64_t sp_unix_peer_answer(const void *buf, size_t n, uint64_t inode)
{
	const struct nlmsghdr *nh = buf;
	const struct unix_diag_msg *m;
	const struct rtattr *at;
	unsigned left;
	uint32_t peer = 0;

	if (!NLMSG_OK(nh, n) || nh->nlmsg_type != SOCK_DIAG_BY_FAMILY ||
	    nh->nlmsg_len < NLMSG_LENGTH(sizeof *m))
		return 0;
	m = NLMSG_DATA(nh);
	if (m->udiag_ino != inode)
		return 0;
	at = (const struct rtattr *)((const char *)m + NLMSG_ALIGN(sizeof *m));
	left = nh->nlmsg_len - NLMSG_LENGTH(sizeof *m);
	for (; RTA_OK(at, left); at = RTA_NEXT(at, left))
		if (at->rta_type == UNIX_DIAG_PEER && RTA_PAYLOAD(at) >= 4)
			memcpy(&peer, RTA_DATA(at), 4);
	return peer;
}
