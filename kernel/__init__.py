"""The Martinet kernel: boot, config, plugins, event bus, pools and the management model.

The kernel knows nothing about messaging. Swiftlets import what they need from here::

    from martinet.kernel import SwiftletSpec, SwiftletContext, config_class, prop, hookimpl

Layers, bottom up: :mod:`kernel.schema` (declaring config), :mod:`kernel.xmlconfig`
(reading and writing it), :mod:`kernel.bus`, :mod:`kernel.pools`, :mod:`kernel.mgmt`
(the live tree), :mod:`kernel.plugins` (finding swiftlets), :mod:`kernel.config` (the
router file), :mod:`kernel.router` (the lifecycle) and :mod:`kernel.cli`.
"""

from .bus import (
    EntityAdded as EntityAdded,
)
from .bus import (
    EntityRemoved as EntityRemoved,
)
from .bus import (
    Event as Event,
)
from .bus import (
    EventBus as EventBus,
)
from .bus import (
    Overflow as Overflow,
)
from .bus import (
    PropertyChanged as PropertyChanged,
)
from .bus import (
    RouterStarted as RouterStarted,
)
from .bus import (
    RouterStopping as RouterStopping,
)
from .bus import (
    SubscriberOverflow as SubscriberOverflow,
)
from .bus import (
    Subscription as Subscription,
)
from .bus import (
    SwiftletStarted as SwiftletStarted,
)
from .bus import (
    SwiftletStopped as SwiftletStopped,
)
from .bus import (
    event_types as event_types,
)
from .config import (
    ConfigError as ConfigError,
)
from .config import (
    ConfigErrors as ConfigErrors,
)
from .config import (
    ConfigProblem as ConfigProblem,
)
from .config import (
    RouterConfig as RouterConfig,
)
from .config import (
    load_config as load_config,
)
from .mgmt import (
    Change as Change,
)
from .mgmt import (
    Entity as Entity,
)
from .mgmt import (
    EntityList as EntityList,
)
from .mgmt import (
    ManagementError as ManagementError,
)
from .mgmt import (
    Operation as Operation,
)
from .mgmt import (
    Parameter as Parameter,
)
from .mgmt import (
    Tree as Tree,
)
from .mgmt import (
    Usage as Usage,
)
from .mgmt import (
    UsageList as UsageList,
)
from .mgmt import (
    Veto as Veto,
)
from .plugins import (
    Command as Command,
)
from .plugins import (
    PluginError as PluginError,
)
from .plugins import (
    Plugins as Plugins,
)
from .plugins import (
    SwiftletSpec as SwiftletSpec,
)
from .plugins import (
    hookimpl as hookimpl,
)
from .plugins import (
    hookspec as hookspec,
)
from .plugins import (
    load_plugins as load_plugins,
)
from .plugins import (
    load_swiftlet_specs as load_swiftlet_specs,
)
from .pools import Pool as Pool
from .pools import PoolFull as PoolFull
from .pools import PoolSpec as PoolSpec
from .router import ExplainedError as ExplainedError
from .router import Router as Router
from .router import SwiftletContext as SwiftletContext
from .router import SwiftletFailed as SwiftletFailed
from .schema import config_class as config_class
from .schema import entity as entity
from .schema import entity_list as entity_list
from .schema import prop as prop
