from typing import Any, Generic, TypeVar

_T = TypeVar("_T")

class DeploymentHandle(Generic[_T]):
    def options(
        self, *, method_name: str = ..., multiplexed_model_id: str = ..., stream: bool = ...,
    ) -> DeploymentHandle[_T]: ...
    def remote(self, *args: object, **kwargs: object) -> Any: ...
    def __getattr__(self, name: str) -> DeploymentHandle[_T]: ...
