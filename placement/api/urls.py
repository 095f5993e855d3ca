from django.urls import path

from . import history_views, quota_views, serving_views, views

urlpatterns = [
    path(
        "fleets/<str:fleet_id>/quotas", quota_views.FleetQuotasView.as_view(), name="fleet-quotas"
    ),
    path("training-jobs", views.TrainingJobsView.as_view(), name="training-jobs"),
    path(
        "training-jobs/<int:job_id>",
        views.TrainingJobDetailView.as_view(),
        name="training-job-detail",
    ),
    path(
        "training-jobs/<int:job_id>/cancel",
        views.TrainingJobCancelView.as_view(),
        name="training-job-cancel",
    ),
    path(
        "training-jobs/<int:job_id>/clear-excluded",
        views.TrainingJobExcludedClearView.as_view(),
        name="training-job-clear-excluded",
    ),
    path(
        "training-jobs/<int:job_id>/logs",
        views.TrainingJobLogsView.as_view(),
        name="training-job-logs",
    ),
    path("lifecycle-jobs", views.LifecycleJobsView.as_view(), name="lifecycle-jobs"),
    path(
        "lifecycle-jobs/<int:job_id>",
        views.LifecycleJobDetailView.as_view(),
        name="lifecycle-job-detail",
    ),
    path(
        "lifecycle-jobs/<int:job_id>/logs",
        views.LifecycleJobLogsView.as_view(),
        name="lifecycle-job-logs",
    ),
    path(
        "lifecycle-jobs/<int:job_id>/clear-excluded",
        views.LifecycleJobExcludedClearView.as_view(),
        name="lifecycle-job-clear-excluded",
    ),
    path(
        "lifecycle-jobs/<int:job_id>/cancel",
        views.LifecycleJobCancelView.as_view(),
        name="lifecycle-job-cancel",
    ),
    path("deployments", views.DeploymentsView.as_view(), name="deployments"),
    path(
        "deployments/<int:deployment_id>",
        views.DeploymentDetailView.as_view(),
        name="deployment-detail",
    ),
    path(
        "deployments/<int:deployment_id>/logs",
        serving_views.DeploymentLogsView.as_view(),
        name="deployment-logs",
    ),
    path(
        "deployments/<int:deployment_id>/revisions",
        views.DeploymentRevisionsView.as_view(),
        name="deployment-revisions",
    ),
    path("playground-sessions", views.PlaygroundSessionsView.as_view(), name="playground-sessions"),
    path(
        "playground-sessions/<int:session_id>",
        serving_views.PlaygroundSessionDetailView.as_view(),
        name="playground-session-detail",
    ),
    path(
        "environments/<int:environment_id>/episodes",
        serving_views.EpisodesView.as_view(),
        name="episodes",
    ),
    path(
        "environments/<int:environment_id>/episodes/<int:number>",
        serving_views.EpisodeDetailView.as_view(),
        name="episode-detail",
    ),
    path(
        "environments/<int:environment_id>/episodes/<int:number>/cancel",
        serving_views.EpisodeCancelView.as_view(),
        name="episode-cancel",
    ),
    path(
        "environments/<int:environment_id>/episodes/<int:number>/logs",
        serving_views.EpisodeLogsView.as_view(),
        name="episode-logs",
    ),
    path("environments", views.EnvironmentsView.as_view(), name="environments"),
    path(
        "environments/<int:environment_id>/resolve",
        views.EnvironmentResolveView.as_view(),
        name="environment-resolve",
    ),
    path("volumes", views.VolumesView.as_view(), name="volumes"),
    path("datasets", views.DatasetsView.as_view(), name="datasets"),
    # A record's history (issue 39): placement.api.history_views.
    path(
        "training-jobs/<int:job_id>/events",
        history_views.TrainingJobEventsView.as_view(),
        name="training-job-events",
    ),
    path(
        "lifecycle-jobs/<int:job_id>/events",
        history_views.LifecycleJobEventsView.as_view(),
        name="lifecycle-job-events",
    ),
    path(
        "deployments/<int:deployment_id>/events",
        history_views.DeploymentEventsView.as_view(),
        name="deployment-events",
    ),
    path(
        "playground-sessions/<int:session_id>/events",
        history_views.PlaygroundSessionEventsView.as_view(),
        name="playground-session-events",
    ),
    path(
        "environments/<int:environment_id>/episodes/<int:number>/events",
        history_views.EpisodeEventsView.as_view(),
        name="episode-events",
    ),
]
