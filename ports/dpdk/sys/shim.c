#include <string.h>
#include <rte_ethdev.h>
#include <rte_mbuf.h>
#include <rte_mbuf_pool_ops.h>
#include <rte_lcore.h>
#include <rte_errno.h>
#include <rte_memcpy.h>
#include "shim.h"

uint16_t shim_rx_burst(uint16_t port, uint16_t queue, struct rte_mbuf **pkts, uint16_t n) {
	return rte_eth_rx_burst(port, queue, pkts, n);
}
uint16_t shim_tx_burst(uint16_t port, uint16_t queue, struct rte_mbuf **pkts, uint16_t n) {
	return rte_eth_tx_burst(port, queue, pkts, n);
}
struct rte_mbuf *shim_pktmbuf_alloc(struct rte_mempool *mp) { return rte_pktmbuf_alloc(mp); }
int shim_pktmbuf_alloc_bulk(struct rte_mempool *mp, struct rte_mbuf **mbufs, unsigned int n) {
	return rte_pktmbuf_alloc_bulk(mp, mbufs, n);
}
void shim_pktmbuf_free(struct rte_mbuf *m) { rte_pktmbuf_free(m); }
uint8_t *shim_mbuf_data(struct rte_mbuf *m) { return rte_pktmbuf_mtod(m, uint8_t *); }
uint16_t shim_mbuf_data_len(const struct rte_mbuf *m) { return m->data_len; }
struct rte_mbuf *shim_mbuf_next(struct rte_mbuf *m) { return m->next; }
uint32_t shim_mbuf_pkt_len(const struct rte_mbuf *m) { return m->pkt_len; }
uint16_t shim_mbuf_tailroom(const struct rte_mbuf *m) { return rte_pktmbuf_tailroom(m); }
uint8_t *shim_pktmbuf_append(struct rte_mbuf *m, uint16_t len) { return (uint8_t *)rte_pktmbuf_append(m, len); }
int shim_pktmbuf_chain(struct rte_mbuf *head, struct rte_mbuf *tail) { return rte_pktmbuf_chain(head, tail); }
void shim_rx_views(struct rte_mbuf *const *m, uint16_t n, const uint8_t **data, uint16_t *len, uint16_t *segs) {
	for (uint16_t i = 0; i < n; i++) {
		data[i] = rte_pktmbuf_mtod(m[i], const uint8_t *);
		len[i] = m[i]->data_len;
		segs[i] = m[i]->nb_segs;
	}
}
uint16_t shim_tx_fill(struct rte_mbuf *const *m, uint16_t n, const uint8_t *const *data, const uint16_t *len) {
	for (uint16_t i = 0; i < n; i++) {
		char *d = rte_pktmbuf_append(m[i], len[i]);
		if (d == NULL)
			return i;
		rte_memcpy(d, data[i], len[i]);
	}
	return n;
}
/* Zero copy: every mbuf of a port's pinned external-buffer pool carries one chunk of the
 * switch's pool at `base` (chunks of `size` bytes). The chunk an mbuf carries is read back
 * from its buf_addr; rebasing writes buf_addr and buf_iova (iova_base + the same offset, or
 * RTE_BAD_IOVA when iova_base is). */
static void rebase(struct rte_mbuf *m, uint8_t *base, uint64_t iova_base, uint32_t chunk, uint32_t size) {
	uint64_t at = (uint64_t)chunk * size;
	m->buf_addr = base + at;
	m->buf_len = (uint16_t)size;
	rte_mbuf_iova_set(m, iova_base == RTE_BAD_IOVA ? RTE_BAD_IOVA : iova_base + at);
}
/* The chunk an mbuf carries, or UINT32_MAX when its buffer is not one whole chunk of the
 * region (`chunks` of them): a driver that attached a buffer of its own is never trusted. */
static uint32_t carried(const struct rte_mbuf *m, const uint8_t *base, uint32_t size, uint32_t chunks) {
	/* `size` is a power of two: shifts and masks, not divisions (tens of cycles each). */
	uintptr_t d = (uintptr_t)m->buf_addr - (uintptr_t)base;
	uintptr_t idx = d >> __builtin_ctz(size);
	if ((d & (size - 1)) != 0 || idx >= chunks || m->buf_len != size)
		return UINT32_MAX;
	return (uint32_t)idx;
}
/* An mbuf of the port's own mempool whose buffer is not a chunk (DPDK or a driver moved it):
 * never written into, never taken for a chunk; the port gives it a fresh one or keeps it. */
#define ASTRAY (UINT32_MAX - 1)
struct chunks_arg { uint8_t *base; uint64_t iova_base; uint32_t *idx; uint32_t n; uint32_t size; uint32_t chunks; int give; };
static void each_chunk(struct rte_mempool *mp, void *opaque, void *obj, unsigned int i) {
	(void)mp;
	struct chunks_arg *a = opaque;
	if (i >= a->n)
		return;
	if (a->give)
		rebase(obj, a->base, a->iova_base, a->idx[i], a->size);
	else
		a->idx[i] = carried(obj, a->base, a->size, a->chunks);
}
uint32_t shim_pool_give_chunks(struct rte_mempool *mp, uint8_t *base, uint64_t iova_base, const uint32_t *idx, uint32_t n, uint32_t size) {
	struct chunks_arg a = { base, iova_base, (uint32_t *)idx, n, size, 0, 1 };
	return rte_mempool_obj_iter(mp, each_chunk, &a);
}
uint32_t shim_pool_take_chunks(struct rte_mempool *mp, uint8_t *base, uint32_t chunks, uint32_t *idx, uint32_t n, uint32_t size) {
	struct chunks_arg a = { base, 0, idx, n, size, chunks, 0 };
	return rte_mempool_obj_iter(mp, each_chunk, &a);
}
void shim_rx_chunks(const struct rte_mempool *mp, struct rte_mbuf *const *m, uint16_t n, const uint8_t *base, uint32_t chunks, uint32_t size, uint32_t *chunk, uint16_t *off, uint16_t *len, uint16_t *segs) {
	for (uint16_t i = 0; i < n; i++) {
		/* An mbuf of another mempool (a vdev that passes mbufs between ports, as net_ring
		 * does) carries no chunk of ours. */
		uint32_t c = m[i]->pool == mp ? carried(m[i], base, size, chunks) : UINT32_MAX;
		chunk[i] = m[i]->pool == mp && c == UINT32_MAX ? ASTRAY : c;
		off[i] = m[i]->data_off;
		len[i] = m[i]->data_len;
		segs[i] = m[i]->nb_segs;
	}
}
void shim_rebase(struct rte_mbuf *const *m, uint16_t n, uint8_t *base, uint64_t iova_base, const uint32_t *chunk, uint32_t size) {
	for (uint16_t i = 0; i < n; i++)
		if (chunk[i] < ASTRAY)
			rebase(m[i], base, iova_base, chunk[i], size);
}
uint16_t shim_tx_lend(struct rte_mbuf *const *m, uint16_t n, uint8_t *base, uint64_t iova_base, uint32_t chunks, uint32_t size, const uint32_t *chunk, const uint16_t *off, const uint16_t *len, uint32_t *old) {
	uint16_t astray = 0;
	for (uint16_t i = 0; i < n; i++) {
		uint32_t c = carried(m[i], base, size, chunks);
		old[i] = UINT32_MAX;
		if (c == UINT32_MAX) {
			old[i] = ASTRAY;
			astray++;
			continue;
		}
		if (chunk[i] == UINT32_MAX)
			continue;
		old[i] = c;
		rebase(m[i], base, iova_base, chunk[i], size);
		m[i]->data_off = off[i];
		m[i]->data_len = len[i];
		m[i]->pkt_len = len[i];
	}
	return astray;
}
void shim_unlend(struct rte_mbuf *const *m, uint16_t n, uint8_t *base, uint64_t iova_base, const uint32_t *old, uint32_t size) {
	for (uint16_t i = 0; i < n; i++) {
		if (old[i] < ASTRAY) {
			rebase(m[i], base, iova_base, old[i], size);
			rte_pktmbuf_reset(m[i]);
		}
	}
}
struct rte_mempool *shim_pool_create_bare(const char *name, unsigned int n, unsigned int cache, uint16_t room, int socket) {
	struct rte_pktmbuf_pool_private priv;
	memset(&priv, 0, sizeof(priv));
	/* As rte_pktmbuf_pool_create, but each object is an mbuf header alone: its buffer
	 * (`room` bytes, as drivers read from the pool) is wherever buf_addr says. The pool is
	 * initialised with no room (a DPDK built with assertions checks objects hold theirs),
	 * then told `room`. */
	struct rte_mempool *mp = rte_mempool_create_empty(name, n, sizeof(struct rte_mbuf), cache, sizeof(priv), socket, 0);
	if (mp == NULL)
		return NULL;
	int r = rte_mempool_set_ops_byname(mp, rte_mbuf_best_mempool_ops(), NULL);
	if (r == 0) {
		rte_pktmbuf_pool_init(mp, &priv);
		((struct rte_pktmbuf_pool_private *)rte_mempool_get_priv(mp))->mbuf_data_room_size = room;
		r = rte_mempool_populate_default(mp);
	}
	if (r < 0) {
		rte_mempool_free(mp);
		rte_errno = -r;
		return NULL;
	}
	rte_mempool_obj_iter(mp, rte_pktmbuf_init, NULL);
	return mp;
}
int shim_iova_is_va(void) { return rte_eal_iova_mode() == RTE_IOVA_VA; }
unsigned int shim_lcore_id(void) { return rte_lcore_id(); }
int shim_errno(void) { return rte_errno; }
