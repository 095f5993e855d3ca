from django import forms
from django.contrib import admin, messages
from django.db.models import Prefetch
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.formats import date_format
from django.utils.html import format_html, format_html_join
from django.views.decorators.clickjacking import xframe_options_sameorigin

from audit.services import Actor
from fleets.admin import register_fleet_inline
from tuneplane.admin import ReadOnlyAdmin
from tuneplane.errors import ApplicationError

from . import logs
from .choices import JOB_ENDED
from .models import (
    Attempt,
    Dataset,
    Deployment,
    Environment,
    Episode,
    LifecycleJob,
    Member,
    PlaygroundSession,
    Quota,
    Revision,
    TrainingJob,
    Volume,
)
from .selectors import deployments_with_status, replica_not_ready, revisions_with_ready
from .services import playground, runs, serving
from .services.quotas import QuotaSpec, quotas_replace
from .services.starts import host


class WorkloadAdmin(ReadOnlyAdmin):
    """Workloads are submitted through the API, where admission answers; here they are read."""

    list_display = [
        "id",
        "name",
        "project",
        "fleet",
        "series",
        "cards",
        "nodes",
        "created_by",
        "created_at",
    ]
    list_filter = ["fleet", "project"]
    search_fields = ["name"]
    list_select_related = ["project", "fleet", "created_by"]

    def _has_env(self) -> bool:
        return any(field.name == "env" for field in self.model._meta.get_fields())

    def get_exclude(self, request, obj=None):
        """An env value is never shown again once submitted (as the API promises): the
        names only (``env_names``)."""
        return [*(super().get_exclude(request, obj) or []), *(["env"] if self._has_env() else [])]

    def get_readonly_fields(self, request, obj=None):
        shown = list(super().get_readonly_fields(request, obj))
        return [*shown, "env_names"] if self._has_env() else shown

    @admin.display(description="Env (names; values are never shown)")
    def env_names(self, record) -> str:
        return ", ".join(sorted(record.env or {})) or "—"


# A job's page shows the tail of its output, read from its node, refreshed while it runs.
OUTPUT_TAIL = 16384
OUTPUT_REFRESH_SECONDS = 5


class ReadOnlyInline(admin.TabularInline):
    """Rows shown with their parent, never edited here. Administrators are staff users
    (tuneplane.admin.StaffAdmin): no model grants."""

    extra = 0
    can_delete = False

    def has_view_permission(self, request, obj=None):
        return request.user.is_active and request.user.is_staff

    def has_add_permission(self, request, obj=None):
        return False

    has_change_permission = has_delete_permission = has_add_permission


class AttemptInline(ReadOnlyInline):
    """Each attempt with its members: rank, node, cards by index and UUID, state, exit, cleanup."""

    model = Attempt
    fk_name = "training_job"
    fields = ["number", "state", "reason", "end_class", "created_at", "started_at", "ended_at"]
    fields += ["members"]
    readonly_fields = fields

    def get_queryset(self, request):
        return super().get_queryset(request).prefetch_related("members").order_by("number")

    @admin.display(description="Members")
    def members(self, attempt) -> str:
        return format_html_join(
            "",
            "<div>rank {} on {}: {} {} · cards {} · exit {} · {}</div>",
            (
                (
                    m.rank,
                    m.node_id,
                    m.state,
                    m.reason,
                    ", ".join(f"{c['index']} ({c['uuid']})" for c in m.cards) or "none",
                    "—" if m.exit_code is None else m.exit_code,
                    f"cleanup {m.cleanup}",
                )
                for m in attempt.members.all()
            ),
        ) or format_html("<span>{}</span>", "—")


class LifecycleAttemptInline(AttemptInline):
    fk_name = "lifecycle_job"


@admin.register(TrainingJob)
class JobAdmin(WorkloadAdmin):
    """A job with its state and attempts; Cancel goes through the service (R10)."""

    # Fits a 1,400 px window beside the nav and filter sidebars (issue 49): the state carries
    # its reason, what the job needs is one column, and who submitted it when another.
    list_display = [
        "id",
        "name",
        "project",
        "fleet",
        "state_shown",
        "waits_because",
        "needs",
        "priority",
        "submitted",
    ]
    list_filter = ["state", *WorkloadAdmin.list_filter]
    inlines = [AttemptInline]
    actions = ["cancel", "clear_excluded"]

    def get_exclude(self, request, obj=None):
        hidden = ["waiting", "waiting_history", "preemption", "excluded"]
        return [*super().get_exclude(request, obj), *hidden]

    def get_readonly_fields(self, request, obj=None):
        return [
            *super().get_readonly_fields(request, obj),
            "excluded_shown",
            "waits_because",
            "waited",
            "preempted",
            "output_tail",
        ]

    def get_urls(self):
        output = path(
            "<int:job_id>/output/",
            # Framed by the job's own page: same origin only (the site's default is DENY).
            xframe_options_sameorigin(self.admin_site.admin_view(self.output)),
            name=f"{self.opts.app_label}_{self.opts.model_name}_output",
        )
        return [output, *super().get_urls()]

    def output(self, request, job_id: int):
        """The tail of the latest attempt's rank 0 output, read from its node now, in a page
        that refreshes itself (the job's page shows it in a frame): a node that is not
        connected, or a job not placed yet, is said, not an error page."""
        job = get_object_or_404(self.model, pk=job_id)
        shown, said = "", ""
        try:
            member = logs.job_member(job=job)
            read = logs.member_output(member=member, tail_bytes=OUTPUT_TAIL)
            shown = logs.shown(read, OUTPUT_TAIL)["output"]
        except ApplicationError as error:
            said = error.message
        context = {
            "title": f"Output of {job}",
            "output": shown,
            "said": said,
            "refresh": OUTPUT_REFRESH_SECONDS if job.state not in JOB_ENDED else None,
        }
        return TemplateResponse(request, "admin/placement/output.html", context)

    @admin.display(description="Output (the tail, refreshed)")
    def output_tail(self, job) -> str:
        url = reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_output", args=[job.pk])
        return format_html(
            '<iframe src="{}" title="output" style="width:100%;height:18em;border:1px solid '
            'var(--hairline-color)"></iframe>',
            url,
        )

    @admin.display(description="Last preempted (Q6)")
    def preempted(self, job) -> str:
        if not job.preemption:
            return "—"
        shown = job.preemption
        return (
            f"at {shown['at'][:19]} for {shown['by']}: {shown['why']}; SIGKILL by "
            f"{shown['deadline'][:19]} at the latest"
        )

    @admin.display(description="Excluded for its next attempts (H2)")
    def excluded_shown(self, job) -> str:
        excluded = job.excluded or {}
        shown = [
            f"node {e['node']}: {e['reason']} (attempt {e['attempt']})"
            for e in excluded.get("nodes") or []
        ] + [
            f"card {e['index']} ({e['uuid']}) of {e['node']}: {e['reason']} "
            f"(attempt {e['attempt']})"
            for e in excluded.get("cards") or []
        ]
        return "; ".join(shown) or "—"

    @admin.display(description="state", ordering="state")
    def state_shown(self, job) -> str:
        return f"{job.state}: {job.reason}" if job.reason else job.state

    @admin.display(description="needs", ordering="cards")
    def needs(self, job) -> str:
        cards = f"{job.cards} × {job.series}" if job.series else f"{job.cards} cards"
        return f"{cards} on {job.nodes} nodes" if job.nodes > 1 else cards

    @admin.display(description="submitted", ordering="created_at")
    def submitted(self, job) -> str:
        at = date_format(timezone.localtime(job.created_at), "Y-m-d H:i")
        return f"{at} by {job.created_by}" if job.created_by else at

    @admin.display(description="Waits because (Q8)")
    def waits_because(self, job) -> str:
        if job.state != "queued" or not job.waiting:
            return "—"
        waiting = job.waiting
        return (
            f"{waiting['reason']}: {waiting['message']} · #{waiting['position_in_project']} "
            f"in its project, #{waiting['position_in_fleet']} on its Fleet"
        )

    @admin.display(description="Reasons it waited")
    def waited(self, job) -> str:
        return " → ".join(f"{c['reason']} ({c['at'][:19]})" for c in job.waiting_history) or "—"

    @admin.action(description="Cancel selected jobs (R10)")
    def cancel(self, request, queryset):
        for job in queryset:
            try:
                runs.job_cancel(actor=Actor.of_user(request.user), job=job)
            except ApplicationError as error:
                self.message_user(request, f"{job}: {error.message}", messages.WARNING)
        self.message_user(
            request,
            "Cancelled: a queued job at once; a running one is stopped (SIGTERM, then SIGKILL "
            "after the grace) and its cards are released once its node has cleaned up.",
            messages.SUCCESS,
        )

    @admin.action(description="Clear excluded nodes and cards of selected jobs (H2)")
    def clear_excluded(self, request, queryset):
        for job in queryset:
            runs.job_excluded_clear(actor=Actor.of_user(request.user), job=job)
        self.message_user(
            request,
            "Cleared: their next attempts may be placed on any node and card again.",
            messages.SUCCESS,
        )


@admin.register(LifecycleJob)
class LifecycleJobAdmin(JobAdmin):
    list_display = JobAdmin.list_display[:2] + ["kind"] + JobAdmin.list_display[2:]
    list_filter = ["kind", *JobAdmin.list_filter]
    inlines = [LifecycleAttemptInline]


class RevisionInline(ReadOnlyInline):
    """Ready as the API reads it: one selector computes it (L2, S1); each replica with its
    node, address and why it is not Ready (a replica on a gone node says so: S3)."""

    model = Revision
    fields = ["number", "state", "reason", "node", "ready", "replica_list", "created_at"]
    readonly_fields = fields

    def get_queryset(self, request):
        members = Member.objects.select_related("node").order_by("rank")
        return revisions_with_ready(super().get_queryset(request)).prefetch_related(
            Prefetch("members", queryset=members)
        )

    @admin.display(boolean=True, description="Ready")
    def ready(self, revision) -> bool:
        return revision.ready

    @admin.display(description="Replicas")
    def replica_list(self, revision) -> str:
        return format_html_join(
            "",
            "<div>replica {} on {} ({}:{}): {} · restarts {} · cleanup {}</div>",
            (
                (
                    m.rank,
                    m.node_id,
                    host(m.node.address),
                    m.port,
                    replica_not_ready(m) or "Ready",
                    m.restarts,
                    m.cleanup,
                )
                for m in revision.members.all()
            ),
        ) or format_html("<span>{}</span>", "—")


@admin.register(Deployment)
class DeploymentAdmin(WorkloadAdmin):
    """Status as the API reads it, for the whole list in its one query (L2)."""

    list_display = WorkloadAdmin.list_display[:4] + ["state", "status", "created_at"]
    list_filter = ["state", *WorkloadAdmin.list_filter]
    readonly_fields = ["status", "reason"]
    inlines = [RevisionInline]
    actions = ["stop"]

    @admin.action(description="Stop selected deployments (their replicas stopped and cleaned)")
    def stop(self, request, queryset):
        for deployment in queryset:
            serving.deployment_update(
                actor=Actor.of_user(request.user), deployment=deployment, state="stopped"
            )
        self.message_user(
            request,
            "Stopped: every replica is stopped (SIGTERM, then SIGKILL after the grace) and "
            "its cards are released once its node has cleaned up.",
            messages.SUCCESS,
        )

    def get_queryset(self, request):
        return deployments_with_status(super().get_queryset(request))

    @admin.display(description="Status", ordering="status")
    def status(self, deployment) -> str:
        return deployment.status


@admin.register(Volume, Dataset)
class StorageAdmin(ReadOnlyAdmin):
    list_display = ["name", "project", "uri", "created_at"]
    list_filter = ["project"]
    search_fields = ["name"]


class EpisodeInline(ReadOnlyInline):
    """An environment's episodes, newest first (S5): state, exit, node, times."""

    model = Episode
    fields = ["number", "state", "reason", "exit_code", "cards", "timeout_seconds", "node"]
    fields += ["created_at", "started_at", "ended_at"]
    readonly_fields = fields

    def get_queryset(self, request):
        return super().get_queryset(request).prefetch_related("members").order_by("-number")

    @admin.display(description="Node")
    def node(self, episode) -> str:
        members = list(episode.members.all())
        return members[-1].node_id if members else "—"


@admin.register(Environment)
class EnvironmentAdmin(WorkloadAdmin):
    inlines = [EpisodeInline]


@admin.register(PlaygroundSession)
class PlaygroundSessionAdmin(WorkloadAdmin):
    """A session with its served process (S4); End goes through the service."""

    list_display = WorkloadAdmin.list_display[:4] + ["state", "ends_at", "created_at"]
    list_filter = ["state", *WorkloadAdmin.list_filter]
    readonly_fields = ["process"]
    actions = ["end"]

    @admin.display(description="Process")
    def process(self, session) -> str:
        return format_html_join(
            "",
            "<div>on {} ({}:{}): {} · restarts {} · cleanup {}</div>",
            (
                (
                    m.node_id,
                    host(m.node.address),
                    m.port,
                    replica_not_ready(m) or "Ready",
                    m.restarts,
                    m.cleanup,
                )
                for m in session.members.select_related("node")
            ),
        ) or format_html("<span>{}</span>", "—")

    @admin.action(description="End selected sessions now (stopped, then cleaned up)")
    def end(self, request, queryset):
        for session in queryset:
            try:
                playground.session_end(actor=Actor.of_user(request.user), session=session)
            except ApplicationError as error:
                self.message_user(request, f"{session}: {error.message}", messages.WARNING)


class QuotaFormSet(forms.BaseInlineFormSet):
    """The Fleet's quotas, saved as a whole through the service (Q1: audited as one change)."""

    def save_through_services(self, request, fleet) -> None:
        self.new_objects, self.changed_objects, self.deleted_objects = [], [], []
        specs = [
            QuotaSpec(
                project=form.cleaned_data["project"].slug,
                series=form.cleaned_data.get("series") or "",
                guaranteed=form.cleaned_data.get("guaranteed") or 0,
                limit=form.cleaned_data.get("limit"),
                weight=form.cleaned_data.get("weight") or 1,
            )
            for form in self.forms
            if form.cleaned_data
            and not form.cleaned_data.get("DELETE")
            and form.cleaned_data.get("project")
        ]
        try:
            quotas_replace(actor=Actor.of_user(request.user), fleet=fleet, specs=specs)
        except ApplicationError as error:
            messages.error(request, f"Quotas not saved: {error}")


class QuotaInline(admin.TabularInline):
    """Q1: per project, the cards it is guaranteed, the most it may hold (empty: unlimited)
    and its weight in fair share; a series, or empty for any card."""

    model = Quota
    formset = QuotaFormSet
    fields = ["project", "series", "guaranteed", "limit", "weight"]
    extra = 0
    verbose_name = "quota"
    verbose_name_plural = "Quotas (Q1): what each project is guaranteed, may hold and weighs"

    def has_view_permission(self, request, obj=None):
        return request.user.is_staff

    has_add_permission = has_change_permission = has_delete_permission = has_view_permission


register_fleet_inline(QuotaInline)
