#ifndef REPLICA_CSODIUM_SHIM_H
#define REPLICA_CSODIUM_SHIM_H
#include <sodium.h>
#endif
