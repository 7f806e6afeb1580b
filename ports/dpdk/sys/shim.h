/* DPDK's fast path is static inline (rx/tx bursts go through rte_eth_fp_ops, mbuf helpers
 * are macros and inlines, rte_errno is per-lcore TLS): these wrappers give Rust a symbol
 * to call. Built at -O3 with DPDK's own cflags. */
#ifndef KNITTER_DPDK_SHIM_H
#define KNITTER_DPDK_SHIM_H
#include <stdint.h>
struct rte_mbuf;
struct rte_mempool;
uint16_t shim_rx_burst(uint16_t port, uint16_t queue, struct rte_mbuf **pkts, uint16_t n);
uint16_t shim_tx_burst(uint16_t port, uint16_t queue, struct rte_mbuf **pkts, uint16_t n);
struct rte_mbuf *shim_pktmbuf_alloc(struct rte_mempool *mp);
int shim_pktmbuf_alloc_bulk(struct rte_mempool *mp, struct rte_mbuf **mbufs, unsigned int n);
void shim_pktmbuf_free(struct rte_mbuf *m);
/* A segment's data, its length, the next segment (or NULL), the packet's whole length. */
uint8_t *shim_mbuf_data(struct rte_mbuf *m);
uint16_t shim_mbuf_data_len(const struct rte_mbuf *m);
struct rte_mbuf *shim_mbuf_next(struct rte_mbuf *m);
uint32_t shim_mbuf_pkt_len(const struct rte_mbuf *m);
uint16_t shim_mbuf_tailroom(const struct rte_mbuf *m);
/* Room for `len` more bytes at the end of the last segment, or NULL. */
uint8_t *shim_pktmbuf_append(struct rte_mbuf *m, uint16_t len);
int shim_pktmbuf_chain(struct rte_mbuf *head, struct rte_mbuf *tail);
/* A burst at once (one call, the mbuf fields read inline): each mbuf's first segment's data
 * and length, and its number of segments. */
void shim_rx_views(struct rte_mbuf *const *m, uint16_t n, const uint8_t **data, uint16_t *len, uint16_t *segs);
/* Copies frame i (`data[i]`, `len[i]` bytes) into fresh mbuf `m[i]`, in order, while each
 * fits its mbuf's tailroom; returns how many were filled. */
uint16_t shim_tx_fill(struct rte_mbuf *const *m, uint16_t n, const uint8_t *const *data, const uint16_t *len);
/* Zero copy over the switch's pool (`chunks` chunks of `size` bytes from `base`; an mbuf
 * carries chunk (buf_addr - base) / size when its buffer is exactly one of them). In the
 * arrays, UINT32_MAX is "none" and UINT32_MAX - 1 "astray": an mbuf of the port's own
 * mempool whose buffer is not a chunk (never written into or taken for one).
 * give/take: every object of the mempool gets chunk idx[i] / reports its chunk (or none)
 * into idx[i] (i < n); they return the objects seen. rx_chunks: each mbuf's chunk (none for
 * an mbuf not of mp, astray), data offset, length and segments. rebase: mbuf i gets chunk[i]
 * (unless none or astray). tx_lend: fresh mbuf i reports its chunk in old[i] and gets
 * chunk[i] with its frame (len[i] bytes at off[i]); left alone when chunk[i] is none, or when
 * it is astray (old[i] says so; counted: the return value). unlend: each mbuf with a chunk
 * in old[i] gets it back and is reset to a fresh, empty mbuf. */
uint32_t shim_pool_give_chunks(struct rte_mempool *mp, uint8_t *base, uint64_t iova_base, const uint32_t *idx, uint32_t n, uint32_t size);
uint32_t shim_pool_take_chunks(struct rte_mempool *mp, uint8_t *base, uint32_t chunks, uint32_t *idx, uint32_t n, uint32_t size);
void shim_rx_chunks(const struct rte_mempool *mp, struct rte_mbuf *const *m, uint16_t n, const uint8_t *base, uint32_t chunks, uint32_t size, uint32_t *chunk, uint16_t *off, uint16_t *len, uint16_t *segs);
void shim_rebase(struct rte_mbuf *const *m, uint16_t n, uint8_t *base, uint64_t iova_base, const uint32_t *chunk, uint32_t size);
uint16_t shim_tx_lend(struct rte_mbuf *const *m, uint16_t n, uint8_t *base, uint64_t iova_base, uint32_t chunks, uint32_t size, const uint32_t *chunk, const uint16_t *off, const uint16_t *len, uint32_t *old);
void shim_unlend(struct rte_mbuf *const *m, uint16_t n, uint8_t *base, uint64_t iova_base, const uint32_t *old, uint32_t size);
/* A pktmbuf pool of `n` bare mbuf headers (no data room of their own; the pool says `room`
 * bytes to drivers): each gets its buffer by rebasing. NULL with rte_errno on failure. */
struct rte_mempool *shim_pool_create_bare(const char *name, unsigned int n, unsigned int cache, uint16_t room, int socket);
/* Whether the EAL runs with IOVA as VA (an mbuf's iova is then its address). */
int shim_iova_is_va(void);
unsigned int shim_lcore_id(void);
int shim_errno(void);
#endif
