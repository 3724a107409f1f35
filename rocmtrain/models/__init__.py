"""DLRM models on TorchRec: builders (``dlrm``) and the LightningModule (``module``)."""

from rocmtrain.models.dlrm import build_dlrm, embedding_bag_configs, feature_names, table_name
from rocmtrain.models.module import DLRMModule

__all__ = ["DLRMModule", "build_dlrm", "embedding_bag_configs", "feature_names", "table_name"]
