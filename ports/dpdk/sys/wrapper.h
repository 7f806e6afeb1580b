/* The DPDK headers the bindings cover, and the shim's prototypes. */
#include <rte_eal.h>
#include <rte_lcore.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>
#include <rte_bus.h>
#include <rte_dev.h>
#include "shim.h"
