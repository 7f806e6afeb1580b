#include <rte_ethdev.h>
#include <rte_mbuf.h>
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
unsigned int shim_lcore_id(void) { return rte_lcore_id(); }
int shim_errno(void) { return rte_errno; }
