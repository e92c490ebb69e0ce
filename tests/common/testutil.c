/* testutil.c — shared test helpers (see testutil.h). */
#include "testutil.h"
