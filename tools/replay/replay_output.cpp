#include "replay/replay_result.hpp"
